-- ---------------------------------------------------------------------------
-- Credit grants: units a tenant may use on top of a meter's period quota (a
-- top-up, a promotion, a prepaid balance).
--
-- consume and track draw the period quota first, then the grants active at
-- their transaction's start (started, not expired, not voided, not
-- exhausted): lowest priority number first, then soonest expiry (grants
-- that never expire last), then oldest.  A hard-limit consume is granted
-- only when quota plus grants cover it, all or nothing; a soft limit draws
-- what the grants hold and reports the rest as overage; track is never
-- refused and draws what the grants hold.  A tenant with no limit on the
-- meter that has been granted credits on it is limited by its grants
-- alone: a hard quota of zero per period (the meter's month when no limit
-- says otherwise), so a prepaid balance is a tenant without a limit and
-- with grants.  The C side is src/grants.c.
--
--   credit_accounts  the (tenant, meter) pairs ever granted credits or
--                    given a reservation: their calls look at grants and
--                    holds (cached with the limits)
--   credit_grants    one row per grant: amount, what was drawn, its order
--   reservations     amounts held against quota and grants until settled,
--                    released or expired (reserve, settle, release)
-- ---------------------------------------------------------------------------

CREATE TABLE flagmeter.credit_accounts (
	tenant		text NOT NULL,
	meter		text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	created_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	grants		boolean NOT NULL DEFAULT true,
	reservations	boolean NOT NULL DEFAULT false,
	PRIMARY KEY (tenant, meter)
);
COMMENT ON TABLE flagmeter.credit_accounts IS
'the tenants and meters that have been granted credits (grants) or made a reservation (reservations): their consumes, tracks and checks look at their grants and holds; one without a limit on the meter but with grants is limited by its grants alone';

-- A new pair changes what the calls do for it: the limits' caches are
-- emptied as for any catalog change (grant_credits inserts only new pairs).
CREATE TRIGGER credit_accounts_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
	ON flagmeter.credit_accounts
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

CREATE SEQUENCE flagmeter.credit_grant_id;
COMMENT ON SEQUENCE flagmeter.credit_grant_id IS 'ids of credit grants, in the order they were made';

CREATE TABLE flagmeter.credit_grants (
	grant_id		bigint PRIMARY KEY DEFAULT pg_catalog.nextval('flagmeter.credit_grant_id'),
	tenant			text NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL CONSTRAINT credit_grants_amount_positive
		CHECK (amount OPERATOR(pg_catalog.>) 0),
	-- never more than the amount, whatever the concurrency (src/grants.c
	-- locks the rows it draws from; this holds the line too)
	drawn			bigint NOT NULL DEFAULT 0 CONSTRAINT credit_grants_drawn_valid
		CHECK (drawn OPERATOR(pg_catalog.>=) 0 AND drawn OPERATOR(pg_catalog.<=) amount),
	priority		integer NOT NULL,
	starts_at		timestamptz NOT NULL,
	expires_at		timestamptz,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	voided_at		timestamptz,
	idempotency_key	text,
	-- grant_low is announced when remaining falls under this share of amount
	low_balance_percent	integer CONSTRAINT credit_grants_low_balance_valid
		CHECK (low_balance_percent OPERATOR(pg_catalog.>=) 1 AND low_balance_percent OPERATOR(pg_catalog.<=) 99),
	CONSTRAINT credit_grants_expiry_valid
		CHECK (expires_at IS NULL OR expires_at OPERATOR(pg_catalog.>) starts_at),
	CONSTRAINT credit_grants_key UNIQUE (tenant, idempotency_key),
	FOREIGN KEY (tenant, meter) REFERENCES flagmeter.credit_accounts ON DELETE CASCADE
) WITH (fillfactor = 80);
COMMENT ON TABLE flagmeter.credit_grants IS
'credit grants: amount units of a meter for a tenant, usable from starts_at until expires_at (NULL: never expires) once the period quota is used up; drawn so far; drawn in order of priority (lowest first), expiry (soonest first), id; voided_at stops a grant';

-- the grants a call may draw from, by (tenant, meter).  drawn is in no
-- index, not even a predicate, and pages keep room (fillfactor), so that a
-- draw is a HOT update: it writes no index entry.
CREATE INDEX credit_grants_drawable ON flagmeter.credit_grants (tenant, meter)
	WHERE voided_at IS NULL;

SELECT pg_catalog.pg_extension_config_dump('flagmeter.credit_accounts', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.credit_grants', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.credit_grant_id', '');

-- A meter that draws from a credit pool has no grants or holds of its own:
-- its balance is its pool's, so credits go to the pool.
CREATE FUNCTION flagmeter.check_not_drawing(meter text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	pool text;
BEGIN
	SELECT m.draws INTO pool FROM flagmeter.meters m WHERE m.meter = check_not_drawing.meter;
	IF pool IS NOT NULL THEN
		RAISE EXCEPTION 'meter "%" draws from the credit pool "%"', meter, pool
			USING ERRCODE = 'feature_not_supported',
			      HINT = format('Grant credits on "%s": every unit of "%s" uses its pool''s.', pool, meter);
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_not_drawing(text) IS
'raises a clear error when meter draws from a credit pool (its grants are the pool''s)';

CREATE FUNCTION flagmeter.grant_credits(tenant text, meter text, amount bigint,
	expires_at timestamptz DEFAULT NULL, priority integer DEFAULT 0,
	starts_at timestamptz DEFAULT pg_catalog.now(), idempotency_key text DEFAULT NULL,
	low_balance_percent integer DEFAULT 10)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	aggregation text;
	id bigint;
	g record;
	b record;
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_meter_exists(meter);
	IF amount IS NULL THEN
		RAISE EXCEPTION 'amount must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF amount <= 0 THEN
		RAISE EXCEPTION 'amount must be positive, not %', amount USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF priority IS NULL THEN
		RAISE EXCEPTION 'priority must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF starts_at IS NULL THEN
		RAISE EXCEPTION 'starts_at must not be NULL' USING ERRCODE = 'null_value_not_allowed',
			HINT = 'Leave it out to start the grant now.';
	END IF;
	IF expires_at IS NOT NULL AND expires_at <= starts_at THEN
		RAISE EXCEPTION 'expires_at must be later than starts_at' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF idempotency_key IS NOT NULL AND (length(idempotency_key) < 1 OR octet_length(idempotency_key) > 256) THEN
		RAISE EXCEPTION 'idempotency_key must be 1 to 256 bytes' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT m.aggregation INTO aggregation FROM flagmeter.meters m WHERE m.meter = grant_credits.meter;
	IF low_balance_percent IS NOT NULL AND (low_balance_percent < 1 OR low_balance_percent > 99) THEN
		RAISE EXCEPTION 'low_balance_percent must be 1 to 99, not %', low_balance_percent
			USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL announces no grant_low.';
	END IF;
	IF aggregation NOT IN ('sum', 'count') THEN
		RAISE EXCEPTION 'meter "%" is a % meter: credits are units of sum and count meters', meter, aggregation
			USING ERRCODE = 'feature_not_supported';
	END IF;
	PERFORM flagmeter.check_not_drawing(meter);

	IF NOT EXISTS (SELECT FROM flagmeter.credit_accounts a
	               WHERE a.tenant = grant_credits.tenant AND a.meter = grant_credits.meter AND a.grants) THEN
		INSERT INTO flagmeter.credit_accounts AS a (tenant, meter)
		VALUES (grant_credits.tenant, grant_credits.meter)
		ON CONFLICT ON CONSTRAINT credit_accounts_pkey DO UPDATE SET grants = true;
	END IF;
	INSERT INTO flagmeter.credit_grants AS c
		(tenant, meter, amount, priority, starts_at, expires_at, idempotency_key, low_balance_percent)
	VALUES (grant_credits.tenant, grant_credits.meter, grant_credits.amount, grant_credits.priority,
	        grant_credits.starts_at, grant_credits.expires_at, grant_credits.idempotency_key,
	        grant_credits.low_balance_percent)
	ON CONFLICT ON CONSTRAINT credit_grants_key DO NOTHING
	RETURNING c.grant_id INTO id;
	IF id IS NULL THEN
		-- a retried key: the grant it made, if it is the same grant
		SELECT * INTO g FROM flagmeter.credit_grants c
		WHERE c.tenant = grant_credits.tenant AND c.idempotency_key = grant_credits.idempotency_key;
		IF g.meter <> meter OR g.amount <> amount OR g.priority <> priority
		   OR g.expires_at IS DISTINCT FROM grant_credits.expires_at THEN
			RAISE EXCEPTION 'idempotency key "%" of tenant "%" names another grant (%)',
				left(idempotency_key, 64), left(tenant, 64), g.grant_id
				USING ERRCODE = 'unique_violation',
				      DETAIL = 'A key names one grant: its meter, amount, priority and expiry.';
		END IF;
		RETURN g.grant_id;
	END IF;

	-- a tenant blocked at its hard limit may consume again
	FOR b IN SELECT bl.period_start FROM flagmeter.blocked bl
	         WHERE bl.tenant = grant_credits.tenant AND bl.meter = grant_credits.meter
	           AND grant_credits.starts_at <= now()
	LOOP
		PERFORM flagmeter.announce('unblocked', tenant, meter, NULL, b.period_start);
	END LOOP;
	RETURN id;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.grant_credits(text, text, bigint, timestamptz, integer, timestamptz, text, integer) IS
'grants a tenant amount units of a sum or count meter on top of its period quota, usable from starts_at until expires_at (NULL: never); drawn lowest priority first, then soonest expiry, then oldest; a tenant without a limit on the meter is limited by its grants alone; grant_low is announced once its remaining falls under low_balance_percent of amount (NULL: never), grant_exhausted when nothing is left, grant_expired (by maintain) when it expires with units left; a retried idempotency key returns the grant it made; returns the grant''s id';

CREATE FUNCTION flagmeter.announce_expired_grants()
RETURNS integer
AS 'MODULE_PATHNAME', 'fm_announce_expired_grants'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.announce_expired_grants() IS
'queues grant_expired (announced at commit) for every grant that expired with units left and was not announced yet; maintain() calls it; returns how many';

CREATE FUNCTION flagmeter.void_grant(grant_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	g record;
BEGIN
	IF grant_id IS NULL THEN
		RAISE EXCEPTION 'grant_id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- waits for a call drawing from it: what that one drew stays drawn
	UPDATE flagmeter.credit_grants c SET voided_at = now()
	WHERE c.grant_id = void_grant.grant_id AND c.voided_at IS NULL
	RETURNING c.tenant, c.meter INTO g;
	IF FOUND THEN
		-- the last grant gone: a tenant at its hard limit is blocked now
		IF NOT EXISTS (SELECT FROM flagmeter.credit_grants c
		               WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.voided_at IS NULL
		                 AND c.drawn < c.amount AND (c.expires_at IS NULL OR c.expires_at > now())) THEN
			PERFORM flagmeter.review_usage(g.tenant, g.meter);
		END IF;
		RETURN true;
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.credit_grants c WHERE c.grant_id = void_grant.grant_id) THEN
		RAISE EXCEPTION 'credit grant % does not exist', grant_id USING ERRCODE = 'undefined_object';
	END IF;
	RETURN false;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.void_grant(bigint) IS
'stops a credit grant: nothing more is drawn from it (what was drawn stays drawn); false when it was already voided';

CREATE VIEW flagmeter.grants AS
SELECT g.grant_id, g.tenant, g.meter, g.amount, g.drawn,
	CASE WHEN g.voided_at IS NOT NULL OR g.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
	     THEN 0::pg_catalog.int8 ELSE g.amount OPERATOR(pg_catalog.-) g.drawn END AS remaining,
	CASE WHEN g.voided_at IS NOT NULL THEN 'voided'
	     WHEN g.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'expired'
	     WHEN g.drawn OPERATOR(pg_catalog.=) g.amount THEN 'exhausted'
	     WHEN g.starts_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'pending'
	     ELSE 'active' END AS state,
	g.priority, g.starts_at, g.expires_at, g.created_at, g.voided_at, g.idempotency_key
FROM flagmeter.credit_grants g;
COMMENT ON VIEW flagmeter.grants IS
'every credit grant with what remains of it (0 once voided or expired) and its state at now(): active, pending (not started), exhausted, expired or voided';

CREATE FUNCTION flagmeter.balance(tenant text, meter text)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT (flagmeter.check($1, $2, 0)).balance $$;
COMMENT ON FUNCTION flagmeter.balance(text, text) IS
'what a tenant may still use of a meter now: the period quota remaining plus what its active credit grants hold; NULL when unlimited and never granted credits';

-- Rollover ------------------------------------------------------------------------
-- A limit with rollover (set_limit(..., rollover, rollover_cap,
-- rollover_periods)) carries a share of each ended period's unused quota
-- into a credit grant: maintain() calls roll_over(), which, for every
-- assigned tenant whose plan's limit on a meter rolls over, looks at the
-- last rollover_periods periods of the limit in force (an override's quota
-- and period count) that have ended, after the tenant was assigned, and
-- grants floor(unused * rollover / 100) units, at most rollover_cap, from
-- the period's end until the end of the rollover_periods-th period after
-- it.  unused is the quota less the period's whole usage (which counts
-- what grants covered), so rolled-over credits never roll over again.
-- Each period is decided once, recorded in rollovers (a period with
-- nothing to roll over too), from the usage recorded by then: a late
-- event for it changes nothing.  A run with nothing due costs one
-- primary-key probe per tenant and meter with rollover: the most recent
-- ended period has its row.

CREATE TABLE flagmeter.rollovers (
	tenant			text NOT NULL,
	meter			text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	period_start	timestamptz NOT NULL,
	period_end		timestamptz NOT NULL,
	quota			bigint NOT NULL,
	used			bigint NOT NULL,
	amount			bigint NOT NULL CONSTRAINT rollovers_amount_valid
		CHECK (amount OPERATOR(pg_catalog.>=) 0),
	-- the grant made (NULL when amount is 0); no foreign key: a grant goes
	-- with its tenant's credit account, and this row with the retention
	grant_id		bigint,
	expires_at		timestamptz NOT NULL,
	rolled_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (tenant, meter, period_start)
);
COMMENT ON TABLE flagmeter.rollovers IS
'one row per ended period that roll_over() decided: the quota and usage it saw, the amount rolled over (0: nothing) and the grant made, until its expiry; maintain() deletes the rows expired for longer than the retention';
SELECT pg_catalog.pg_extension_config_dump('flagmeter.rollovers', '');

CREATE FUNCTION flagmeter.roll_over()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r record;
	p record;
	ends timestamptz[];
	period_used bigint;
	share bigint;
	grant_key text;
	id bigint;
	made integer := 0;
	tenant_made integer;
BEGIN
	-- the tenants and meters whose most recent ended period is not decided
	FOR r IN
		SELECT t.tenant, l.meter, t.assigned_at, c.aggregation, c.quota, c.period, c.anchor, c.timezone,
		       l.rollover, l.rollover_cap, l.rollover_periods, cur.period_end AS current_end,
		       last.period_start AS last_start, last.period_end AS last_end
		FROM flagmeter.limits l
		JOIN flagmeter.tenants t ON t.plan = l.plan
		CROSS JOIN LATERAL flagmeter.limit_config(t.tenant, l.meter) c
		CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) cur
		CROSS JOIN LATERAL flagmeter.period_bounds(cur.period_start - interval '1 microsecond',
		                                           c.period, c.anchor, c.timezone) last
		JOIN flagmeter.meters m ON m.meter = l.meter
		WHERE l.rollover IS NOT NULL AND m.draws IS NULL
		  AND c.period <> 'lifetime' AND c.aggregation IN ('sum', 'count')
		  AND last.period_end > t.assigned_at
		  AND NOT EXISTS (SELECT FROM flagmeter.rollovers x
		                  WHERE x.tenant = t.tenant AND x.meter = l.meter
		                    AND x.period_start = last.period_start)
		ORDER BY t.tenant, l.meter
	LOOP
		-- ends[k]: the end of the (k-1)-th period after the current one; the
		-- grant of the i-th ended period back expires at ends[rollover_periods - i + 1]
		ends := ARRAY[r.current_end];
		FOR k IN 2..r.rollover_periods LOOP
			ends := ends || (flagmeter.period_bounds(ends[k - 1], r.period, r.anchor, r.timezone)).period_end;
		END LOOP;
		SELECT r.last_start AS period_start, r.last_end AS period_end INTO p;
		tenant_made := 0;
		-- newest first; a period already decided means the older ones were
		-- decided with it; older than rollover_periods back, the grant
		-- would have expired
		BEGIN
			FOR i IN 1..r.rollover_periods LOOP
				EXIT WHEN p.period_end <= r.assigned_at;
				period_used := COALESCE(flagmeter.used_by(flagmeter.usage(r.tenant, r.meter, p.period_start), r.aggregation), 0);
				share := floor(greatest(r.quota - period_used, 0)::numeric * r.rollover / 100);
				share := least(share, COALESCE(r.rollover_cap, share));
				INSERT INTO flagmeter.rollovers AS x (tenant, meter, period_start, period_end, quota, used,
				                                      amount, expires_at)
				VALUES (r.tenant, r.meter, p.period_start, p.period_end, r.quota, period_used,
				        share, ends[r.rollover_periods - i + 1])
				ON CONFLICT ON CONSTRAINT rollovers_pkey DO NOTHING;
				EXIT WHEN NOT FOUND;
				IF share > 0 THEN
					grant_key := 'rollover:' || r.meter || ':'
					       || to_char(p.period_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
					-- a grant under the key already (a row deleted by the
					-- retention, a lifetime changed since): that one stands
					SELECT g.grant_id INTO id FROM flagmeter.credit_grants g
					WHERE g.tenant = r.tenant AND g.idempotency_key = grant_key;
					IF NOT FOUND THEN
						id := flagmeter.grant_credits(r.tenant, r.meter, share,
						                              expires_at => ends[r.rollover_periods - i + 1],
						                              starts_at => p.period_end, idempotency_key => grant_key);
						tenant_made := tenant_made + 1;
					END IF;
					UPDATE flagmeter.rollovers x SET grant_id = id
					WHERE x.tenant = r.tenant AND x.meter = r.meter AND x.period_start = p.period_start;
				END IF;
				SELECT * INTO p FROM flagmeter.period_bounds(p.period_start - interval '1 microsecond',
				                                             r.period, r.anchor, r.timezone);
			END LOOP;
			made := made + tenant_made;
		EXCEPTION WHEN object_not_in_prerequisite_state THEN
			-- a tenant being moved to another shard (fence_partition): its
			-- periods are decided there, with the rows the move copies
			NULL;
		END;
	END LOOP;
	RETURN made;
END $$;
COMMENT ON FUNCTION flagmeter.roll_over() IS
'grants, for every assigned tenant whose plan''s limit rolls over, the rollover share of the unused quota of each of its last rollover_periods ended periods not decided yet (ended after it was assigned), capped at rollover_cap, from the period''s end to the end of the rollover_periods-th period after it, under the key rollover:<meter>:<period start, UTC>; records each period in rollovers; maintain() calls it; returns how many grants it made';

-- Reservations --------------------------------------------------------------------
-- reserve holds an amount against quota and grants, under the period's
-- stripe 0 lock as consume decides: every consume and reserve of the
-- tenant's meter counts the holds as used, until settle records the actual
-- usage (as a consume that is never refused: the work was done), release
-- gives the hold back, or the ttl passes (then it counts for nobody, at
-- once: holds are active only while expires_at is after the transaction's
-- start).  maintain() only deletes old rows.  Sum meters only.

CREATE SEQUENCE flagmeter.reservation_id;
COMMENT ON SEQUENCE flagmeter.reservation_id IS 'ids of reservations';

CREATE TABLE flagmeter.reservations (
	reservation_id	bigint PRIMARY KEY DEFAULT pg_catalog.nextval('flagmeter.reservation_id'),
	tenant			text NOT NULL,
	meter			text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	amount			bigint NOT NULL CONSTRAINT reservations_amount_positive
		CHECK (amount OPERATOR(pg_catalog.>) 0),
	created_at		timestamptz NOT NULL,
	expires_at		timestamptz NOT NULL,
	settled_at		timestamptz,
	actual			bigint,
	released_at		timestamptz,
	idempotency_key	text,
	CONSTRAINT reservations_key UNIQUE (tenant, idempotency_key)
);
COMMENT ON TABLE flagmeter.reservations IS
'amounts held against a tenant''s quota and grants: active until settled (actual recorded), released, or expires_at; maintain() deletes them once expired for longer than the retention';

-- the holds a decision counts, by (tenant, meter)
CREATE INDEX reservations_open ON flagmeter.reservations (tenant, meter)
	WHERE settled_at IS NULL AND released_at IS NULL;

SELECT pg_catalog.pg_extension_config_dump('flagmeter.reservations', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.reservation_id', '');

CREATE FUNCTION flagmeter.reserve(tenant text, meter text, amount bigint,
	ttl interval DEFAULT '5 minutes', idempotency_key text DEFAULT NULL,
	OUT granted boolean, OUT reservation_id bigint, OUT reserved bigint,
	OUT expires_at timestamptz, OUT balance bigint, OUT retry_after interval)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_reserve'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.reserve(text, text, bigint, interval, text) IS
'holds amount of a sum meter against the tenant''s quota and credit grants for ttl, all or nothing as a hard-limit consume decides: granted with a reservation_id, or refused (reservation_id NULL); balance is what is left after it; the tenant''s rate limit for the meter applies to amount too (refused for it: retry_after says when it would fit); a retried idempotency key returns the reservation it made';

CREATE FUNCTION flagmeter.settle(reservation_id bigint, actual bigint)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_settle'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.settle(bigint, bigint) IS
'ends a reservation by recording actual (>= 0) as usage, as a consume that is never refused (more than reserved goes past the limits as overage, hard or soft), drawing grants past the quota; the rest of the hold is freed; an error once settled, released or expired';

CREATE FUNCTION flagmeter.release(reservation_id bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_release'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.release(bigint) IS
'gives a reservation''s hold back without recording usage; false when it was settled, released or expired already';
