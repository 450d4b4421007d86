-- The allocator behind Envoy's Rate Limit Quota Service (issue 35; docs/adr/0041). Each Envoy
-- decides its requests from token buckets the server assigns it; what every assignment could
-- still admit is counted here, per governed bucket, so that all the Envoys of every replica
-- together never admit more than the rule's burst + rate x window.
--
-- The accounting, for one bucket of rate R and burst B: a pool of tokens P, and per holder (an
-- Envoy's stream) the share it may use. Admissions are drawn from V = P + what the Envoys'
-- buckets hold. An Envoy's bucket holds at most its max_tokens M_i and fills at r_i; the pool
-- fills at R - sum(r_i) and is capped at B - sum(M_i), so V <= B and V gains at most R a
-- second. A token bucket an Envoy builds full (its first, or after a DENY_ALL or an expiry) is
-- paid for from the pool; one that replaces another carries its tokens over in proportion
-- (Envoy since #37624), so only a larger max_tokens is paid for, and only the growth. What an
-- Envoy might still be using counts: a share is counted at the larger of the old and the new
-- until the Envoy can no longer use the old one (its TTL lapsed, or a report arrived more than
-- a round trip after the new one was sent), and a closed stream's share until its last
-- assignment expires. Times are the database's clock, one clock for every replica.

CREATE TABLE plexsphere.quota_buckets (
    key uuid PRIMARY KEY,
    service text NOT NULL,
    rule_id text NOT NULL,
    -- The rule as last assigned by (tokens a second; tokens): the pool accrued at this rate.
    rate double precision NOT NULL CHECK (rate >= 0),
    burst double precision NOT NULL CHECK (burst >= 0),
    -- The pool's tokens at pool_at.
    pool double precision NOT NULL CHECK (pool >= 0),
    pool_at timestamptz NOT NULL
);

CREATE TABLE plexsphere.quota_shares (
    key uuid NOT NULL REFERENCES plexsphere.quota_buckets ON DELETE CASCADE,
    -- One bucket of one Envoy: its stream and its bucket_id (several bucket_ids a rule keys
    -- alike are several token buckets in the Envoy, each a holder of its own); the stream, to
    -- close its holders when it ends; the replica serving it (for the operator page).
    holder uuid NOT NULL,
    stream uuid NOT NULL,
    replica text NOT NULL,
    -- Requests a second (allowed and denied) over its last report; NULL until it has reported
    -- an interval: a newcomer, whose demand is not known yet.
    demand double precision,
    reported_at timestamptz NOT NULL,
    -- Since when its reports have shown no request, in a row.
    idle_since timestamptz,
    -- The assignment last sent: a token bucket of max_tokens `burst`, `tokens_per_fill` every
    -- `fill_seconds` (burst 0: DENY_ALL or none), sent at sent_at; nothing it allows can be
    -- used after expires_at (its TTL plus the largest round trip).
    tokens_per_fill bigint NOT NULL DEFAULT 0,
    fill_seconds integer NOT NULL DEFAULT 1 CHECK (fill_seconds >= 1),
    burst double precision NOT NULL DEFAULT 0,
    sent_at timestamptz,
    expires_at timestamptz,
    -- What earlier assignments the Envoy may still be using allow, counted until old_until.
    old_rate double precision NOT NULL DEFAULT 0,
    old_burst double precision NOT NULL DEFAULT 0,
    old_until timestamptz,
    -- The stream ended (or the bucket was abandoned): no new share; counted until expiry.
    closed_at timestamptz,
    -- Its last grant fell short of nine tenths of its fair share: capacity others still
    -- hold is owed to it, and whoever frees some says so (below).
    short boolean NOT NULL DEFAULT false,
    PRIMARY KEY (key, holder)
);

CREATE INDEX quota_shares_stream ON plexsphere.quota_shares (stream);

-- What a share counts against its rule at `at`: the larger of what the assignment last sent
-- and the older ones still usable allow.
CREATE FUNCTION plexsphere.quota_counted_rate(share plexsphere.quota_shares, at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(
        CASE WHEN share.expires_at > at THEN share.tokens_per_fill::double precision / share.fill_seconds ELSE 0 END,
        CASE WHEN share.old_until > at THEN share.old_rate ELSE 0 END)
$$;

CREATE FUNCTION plexsphere.quota_counted_burst(share plexsphere.quota_shares, at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(
        CASE WHEN share.expires_at > at THEN share.burst ELSE 0 END,
        CASE WHEN share.old_until > at THEN share.old_burst ELSE 0 END)
$$;

-- One report of one bucket by one holder (or, with report false, a push: a rule changed), in
-- one statement: the pool accrues, the holder's demand is recorded, its max-min fair share of
-- rate x (1 - reserve) is granted as far as what the others still hold allows, and the
-- assignment to send is returned. The bucket's row is locked for the statement, so every
-- replica's reports of one bucket are decided one at a time.
--
-- decision: 'token_bucket' (max_tokens, tokens_per_fill every fill_seconds), 'deny' (no share
-- can be granted now: DENY_ALL), 'abandon' (no demand for idle_after).
-- prior_rate and prior_burst: the share in force before this report.
CREATE FUNCTION plexsphere.quota_assign(
    p_key uuid,
    p_service text,
    p_rule text,
    p_rate double precision,
    p_burst double precision,
    p_holder uuid,
    p_stream uuid,
    p_replica text,
    p_report boolean,
    p_requests bigint,
    p_elapsed double precision,
    p_fill_seconds integer,
    p_ttl_seconds integer,
    p_max_rtt double precision,
    p_reserve double precision,
    p_headroom double precision,
    p_burst_share double precision,
    p_idle_after double precision,
    -- The stream cannot vouch for what was sent: the last statement for this holder failed,
    -- and may have committed a send that never left. No report proves anything then, and the
    -- next token bucket is built full.
    p_unsure boolean,
    -- What the Envoy's bucket holds is not this row's last token bucket (its last assignment
    -- was a blanket rule, or another rule's bucket): the next token bucket is built full.
    p_builds_full boolean,
    OUT decision text,
    OUT max_tokens bigint,
    OUT tokens_per_fill bigint,
    OUT prior_rate double precision,
    OUT prior_burst double precision
)
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz;
    rtt interval := make_interval(secs => p_max_rtt);
    bucket plexsphere.quota_buckets;
    mine plexsphere.quota_shares;
    before_rate double precision;
    before_burst double precision;
    others_rate double precision;
    others_burst double precision;
    capacity double precision := p_rate * (1 - p_reserve);
    wants double precision[];
    my_want double precision;
    level double precision;
    left_over double precision;
    unmet integer;
    holders integer;
    want double precision;
    granted double precision;
    fill bigint;
    tokens double precision;
    holds boolean;
    charge double precision;
    elapsed double precision;
    freed boolean := false;
    falls_short boolean;
BEGIN
    INSERT INTO plexsphere.quota_buckets AS b (key, service, rule_id, rate, burst, pool, pool_at)
    VALUES (p_key, p_service, p_rule, p_rate, p_burst, p_burst, clock_timestamp())
    ON CONFLICT (key) DO UPDATE SET service = excluded.service
    RETURNING * INTO bucket;
    -- The time, once the bucket's lock is held: a send is recorded no earlier than it is made.
    at := clock_timestamp();

    -- The pool accrues over [pool_at, at] by what was counted at pool_at: shares only expire
    -- between statements, so that count is the largest of the interval (the pool accrues no
    -- faster, and is capped no higher, than it did).
    SELECT coalesce(sum(plexsphere.quota_counted_rate(s, bucket.pool_at)), 0),
           coalesce(sum(plexsphere.quota_counted_burst(s, bucket.pool_at)), 0)
    INTO before_rate, before_burst
    FROM plexsphere.quota_shares s WHERE s.key = p_key;
    -- A rule lowered under what is still counted leaves the pool empty, not in debt: what
    -- the old assignments can still admit beyond the new rule is the change's own cost, bounded
    -- by their TTL, and is not paid back by refusing under the new rule afterwards.
    bucket.pool := greatest(0, least(
        least(bucket.burst, p_burst) - before_burst,
        bucket.pool + greatest(0, bucket.rate - before_rate) * extract(epoch FROM at - bucket.pool_at)));

    -- Holders gone for good: nothing they were sent can be used, and they no longer report.
    DELETE FROM plexsphere.quota_shares s
    WHERE s.key = p_key AND s.holder <> p_holder
      AND coalesce(greatest(s.expires_at, s.old_until), s.reported_at) < at - interval '1 minute'
      AND (s.closed_at IS NOT NULL OR s.reported_at < at - interval '1 minute');

    SELECT * INTO mine FROM plexsphere.quota_shares s WHERE s.key = p_key AND s.holder = p_holder FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO plexsphere.quota_shares (key, holder, stream, replica, reported_at)
        VALUES (p_key, p_holder, p_stream, p_replica, at)
        RETURNING * INTO mine;
    END IF;
    prior_rate := CASE WHEN mine.expires_at > at THEN mine.tokens_per_fill::double precision / mine.fill_seconds ELSE 0 END;
    prior_burst := CASE WHEN mine.expires_at > at THEN mine.burst ELSE 0 END;

    IF p_report THEN
        -- Its demand over the interval, by the server's clock when it reported before (Envoy
        -- truncates time_elapsed to whole seconds).
        elapsed := CASE WHEN mine.demand IS NOT NULL OR mine.sent_at IS NOT NULL
                        THEN greatest(p_elapsed, extract(epoch FROM at - mine.reported_at))
                        ELSE p_elapsed END;
        IF p_elapsed = 0 THEN
            -- A bucket's first report (Envoy sends 0s only then, at its first request, and again
            -- when an abandoned bucket comes back): a newcomer, whatever it wanted before.
            mine.demand := NULL;
        ELSIF elapsed >= 1 THEN
            mine.demand := p_requests / elapsed;
        END IF;
        mine.idle_since := CASE WHEN p_requests = 0 AND elapsed >= 1 THEN coalesce(mine.idle_since, at) END;
        mine.reported_at := at;
        mine.replica := p_replica;
        mine.closed_at := NULL;
        IF NOT p_unsure AND (mine.sent_at IS NULL OR at - mine.sent_at > rtt) THEN
            -- Sent after it had the last assignment: it uses that one, no older; a shrink it
            -- confirms frees capacity another holder may be waiting for.
            freed := mine.old_until > at
                AND mine.old_rate > mine.tokens_per_fill::double precision / mine.fill_seconds;
            mine.old_rate := 0;
            mine.old_burst := 0;
            mine.old_until := NULL;
        END IF;
        -- Otherwise the report crossed the last assignment: the Envoy may be using it or the
        -- one before, so both stay counted (below, the last joins the old at the larger of
        -- each), and the new one is sent as a push would be.
        IF mine.idle_since IS NOT NULL AND at - mine.idle_since >= make_interval(secs => p_idle_after) THEN
            -- No demand for a while: the Envoy erases the bucket, and what it was sent counts
            -- until it expires.
            -- What it was last sent becomes the old share, counted until it expires; it holds
            -- no bucket any more, so the next one it is sent is built full and paid for.
            UPDATE plexsphere.quota_shares s
            SET demand = mine.demand, idle_since = mine.idle_since, reported_at = mine.reported_at,
                old_rate = greatest(
                    CASE WHEN mine.old_until > at THEN mine.old_rate ELSE 0 END,
                    CASE WHEN s.expires_at > at THEN s.tokens_per_fill::double precision / s.fill_seconds ELSE 0 END),
                old_burst = greatest(
                    CASE WHEN mine.old_until > at THEN mine.old_burst ELSE 0 END,
                    CASE WHEN s.expires_at > at THEN s.burst ELSE 0 END),
                old_until = greatest(CASE WHEN mine.old_until > at THEN mine.old_until END, s.expires_at),
                tokens_per_fill = 0, burst = 0, sent_at = at, closed_at = at
            WHERE s.key = p_key AND s.holder = p_holder;
            UPDATE plexsphere.quota_buckets b SET rate = p_rate, burst = p_burst, pool = bucket.pool, pool_at = at
            WHERE b.key = p_key;
            decision := 'abandon';
            RETURN;
        END IF;
    END IF;

    -- Max-min fair: the water level at which the open holders' demands (a newcomer's is
    -- unbounded) fill the capacity. Headroom comes only from what their demands leave, split
    -- evenly: a share may follow a growing demand, never at another's expense; the rest stays
    -- unassigned, so a newcomer finds it at once. (Water-filling demand x headroom instead
    -- left every share not saturated (headroom - 1) x its demand of waste: ADR 0041.)
    SELECT array_agg(w ORDER BY w) INTO wants FROM (
        SELECT CASE WHEN s.holder = p_holder THEN coalesce(mine.demand, 'Infinity')
                    ELSE coalesce(s.demand, 'Infinity') END AS w
        FROM plexsphere.quota_shares s
        WHERE s.key = p_key
          AND (s.holder = p_holder
               OR (s.closed_at IS NULL AND s.reported_at > at - make_interval(secs => 2 * p_ttl_seconds)))
    ) o;
    my_want := coalesce(mine.demand, 'Infinity');
    left_over := capacity;
    holders := coalesce(array_length(wants, 1), 1);
    unmet := coalesce(array_length(wants, 1), 0);
    level := 'Infinity';
    FOREACH want IN ARRAY coalesce(wants, '{}') LOOP
        IF want * unmet > left_over THEN
            level := left_over / unmet;
            left_over := 0;
            EXIT;
        END IF;
        left_over := left_over - want;
        unmet := unmet - 1;
    END LOOP;
    -- Its fair share, and its headroom from what no demand takes: at least a token a fill, so
    -- a bucket idle for an interval keeps a token for its next request.
    my_want := least(my_want, level)
        + least(greatest(my_want * (p_headroom - 1), 1.0 / p_fill_seconds), left_over / holders);

    SELECT coalesce(sum(plexsphere.quota_counted_rate(s, at)), 0),
           coalesce(sum(plexsphere.quota_counted_burst(s, at)), 0)
    INTO others_rate, others_burst
    FROM plexsphere.quota_shares s WHERE s.key = p_key AND s.holder <> p_holder;
    granted := greatest(0, least(my_want, capacity - others_rate));
    IF NOT p_report AND mine.reported_at < at - make_interval(secs => 2 * p_ttl_seconds) THEN
        -- A push to a holder that stopped reporting (its stream may be dead, unnoticed): it
        -- renews nothing, so a dead holder's share lapses.
        granted := 0;
    END IF;
    fill := least(floor(granted * p_fill_seconds), 4294967295)::bigint;

    -- max_tokens: its part of burst_share x burst, at least one token; within what the others
    -- leave of the burst; what it adds paid for from the pool.
    tokens := greatest(1, floor(p_burst_share * p_burst * fill / p_fill_seconds / nullif(capacity, 0)));
    tokens := least(tokens, floor(p_burst - others_burst), 4294967295);
    -- Whether the Envoy will still hold the token bucket last sent when this one arrives.
    holds := NOT p_unsure AND NOT p_builds_full AND mine.burst >= 1 AND mine.expires_at - rtt > at + rtt;
    charge := CASE WHEN holds THEN greatest(0, tokens - mine.burst) ELSE tokens END;
    IF charge > bucket.pool THEN
        tokens := CASE WHEN holds THEN least(tokens, mine.burst + greatest(0, floor(bucket.pool)))
                       ELSE greatest(0, floor(bucket.pool)) END;
        charge := CASE WHEN holds THEN greatest(0, tokens - mine.burst) ELSE tokens END;
    END IF;
    -- A fill interval changed under an otherwise equal bucket would keep the old bucket (Envoy
    -- compares only the interval's nanos): one token a fill less makes it a new one.
    IF fill > 0 AND mine.fill_seconds <> p_fill_seconds AND fill = mine.tokens_per_fill AND tokens = mine.burst THEN
        fill := fill - 1;
    END IF;
    IF fill < 1 OR tokens < 1 THEN
        decision := 'deny';
        fill := 0;
        tokens := 0;
        charge := 0;
    ELSE
        decision := 'token_bucket';
    END IF;

    -- What was sent last stays counted until the Envoy can no longer use it.
    IF mine.expires_at > at THEN
        mine.old_rate := greatest(CASE WHEN mine.old_until > at THEN mine.old_rate ELSE 0 END,
                                  mine.tokens_per_fill::double precision / mine.fill_seconds);
        mine.old_burst := greatest(CASE WHEN mine.old_until > at THEN mine.old_burst ELSE 0 END, mine.burst);
        mine.old_until := greatest(mine.old_until, mine.expires_at);
    END IF;
    falls_short := granted < 0.9 * least(coalesce(mine.demand, 'Infinity'), level, capacity);
    UPDATE plexsphere.quota_shares s
    SET demand = mine.demand, idle_since = mine.idle_since, reported_at = mine.reported_at,
        replica = mine.replica, closed_at = mine.closed_at, short = falls_short,
        tokens_per_fill = fill, fill_seconds = p_fill_seconds, burst = tokens,
        sent_at = at, expires_at = at + make_interval(secs => p_ttl_seconds) + rtt,
        old_rate = mine.old_rate, old_burst = mine.old_burst, old_until = mine.old_until
    WHERE s.key = p_key AND s.holder = p_holder;
    UPDATE plexsphere.quota_buckets b
    SET rate = p_rate, burst = p_burst, rule_id = p_rule, pool = bucket.pool - charge, pool_at = at
    WHERE b.key = p_key;
    max_tokens := tokens::bigint;
    tokens_per_fill := fill;
    -- A report that first finds its holder well short of its fair share (the others must
    -- shrink for it), or that frees capacity while another holder is short, tells every
    -- replica, whose streams holding the bucket answer at once rather than at their own next
    -- reports. Only a report tells (a push never does), and only at a shortage's start or
    -- while one lasts, so a steady state pushes nothing: one statement a report.
    IF p_report AND ((falls_short AND NOT mine.short)
        OR (freed AND EXISTS (SELECT FROM plexsphere.quota_shares s
                              WHERE s.key = p_key AND s.holder <> p_holder AND s.short AND s.closed_at IS NULL)))
    THEN
        PERFORM pg_notify('plexsphere_quota', p_key::text);
    END IF;
END
$$;

-- A stream ended: its shares take no new demand, and count until what they were sent expires.
-- Even after a goodbye (every assignment again with a TTL of zero): nothing says it arrived,
-- and an Envoy that missed it enforces its last assignment until the TTL.
CREATE FUNCTION plexsphere.quota_close(p_stream uuid) RETURNS void
LANGUAGE sql AS $$
    UPDATE plexsphere.quota_shares SET closed_at = clock_timestamp()
    WHERE stream = p_stream AND closed_at IS NULL
$$;

-- The leader's sweep of what no longer counts: a share whose assignments had all expired an
-- hour ago and before its bucket's pool was last accrued (so no accrual still reads it), then
-- a bucket with no share left once its pool would be full anyway (nothing counted, it refills
-- at the whole rate: made again, full, it gives nothing away). Returns the rows deleted.
CREATE FUNCTION plexsphere.quota_sweep() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();
    shares bigint;
    buckets bigint;
BEGIN
    DELETE FROM plexsphere.quota_shares s
    USING plexsphere.quota_buckets b
    WHERE b.key = s.key
      AND coalesce(greatest(s.expires_at, s.old_until), s.reported_at) < least(b.pool_at, at - interval '1 hour')
      AND s.reported_at < at - interval '1 hour';
    GET DIAGNOSTICS shares = ROW_COUNT;
    -- pool_at an hour old too: a report that made a share meanwhile moved it, and the row is
    -- checked again once its lock is free.
    DELETE FROM plexsphere.quota_buckets b
    WHERE NOT EXISTS (SELECT FROM plexsphere.quota_shares s WHERE s.key = b.key)
      AND b.pool_at < at - interval '1 hour'
      AND b.rate > 0
      AND b.pool_at + make_interval(secs => greatest(0, b.burst - b.pool) / b.rate) < at;
    GET DIAGNOSTICS buckets = ROW_COUNT;
    RETURN shares + buckets;
END
$$;
