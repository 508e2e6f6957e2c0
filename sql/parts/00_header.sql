-- flagmeter install script, built from sql/parts/*.sql (one file per concern).
-- Everything is schema-qualified; no CREATE OR REPLACE, no IF NOT EXISTS.

\echo Use "CREATE EXTENSION flagmeter" to load this file. \quit

