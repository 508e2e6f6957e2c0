-- The dashboard app's own schema: webhook alerts.  Applied by the app at
-- start (src/sql/schema.js), under an advisory lock so that instances
-- starting together do not race; every statement is idempotent.
--
-- webhooks         where alerts go: per tenant, or for every tenant (NULL);
--                  only quota events after since_version are sent
-- webhook_scan     how far the deliverer has read flagmeter.outbox
-- webhook_cursors  per webhook and tenant: the last version delivered
--                  (the delivery cursor), the last version the scan found,
--                  and the retry state of the head event

CREATE SCHEMA IF NOT EXISTS dashboard;

CREATE TABLE IF NOT EXISTS dashboard.webhooks (
	id				bigserial PRIMARY KEY,
	tenant			text,
	url				text NOT NULL CONSTRAINT webhooks_url_http CHECK (url ~ '^https?://'),
	created_at		timestamptz NOT NULL DEFAULT now(),
	since_version	bigint NOT NULL DEFAULT flagmeter.latest_version()
);
COMMENT ON TABLE dashboard.webhooks IS
'webhook URLs for quota alerts: one tenant, or every tenant when tenant is NULL; events after since_version are delivered';

CREATE TABLE IF NOT EXISTS dashboard.webhook_scan (
	singleton		boolean PRIMARY KEY DEFAULT true CONSTRAINT webhook_scan_singleton CHECK (singleton),
	scanned_through	bigint NOT NULL
);
INSERT INTO dashboard.webhook_scan (scanned_through) VALUES (flagmeter.latest_version())
ON CONFLICT DO NOTHING;
COMMENT ON TABLE dashboard.webhook_scan IS
'the outbox version up to which the deliverer has created or advanced webhook_cursors';

CREATE TABLE IF NOT EXISTS dashboard.webhook_cursors (
	webhook_id		bigint NOT NULL REFERENCES dashboard.webhooks ON DELETE CASCADE,
	tenant			text NOT NULL,
	delivered_through bigint NOT NULL,
	pending_through	bigint NOT NULL,
	attempts		integer NOT NULL DEFAULT 0,
	next_attempt_at	timestamptz NOT NULL DEFAULT now(),
	last_attempt_at	timestamptz,
	last_error		text,
	delivered		bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (webhook_id, tenant)
);
CREATE INDEX IF NOT EXISTS webhook_cursors_due ON dashboard.webhook_cursors (next_attempt_at)
	WHERE delivered_through < pending_through;
COMMENT ON TABLE dashboard.webhook_cursors IS
'delivery cursor per webhook and tenant: events up to delivered_through were answered 2xx; attempts and next_attempt_at are the retry state of the next one';
