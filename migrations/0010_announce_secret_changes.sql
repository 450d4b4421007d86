-- A written, replaced or deleted secret is announced on the channel plexsphere_secret_changed,
-- with `domain_id:name` as the payload, when its transaction commits (NOTIFY is
-- transactional). Every replica keeps recently read secrets (sealed) in memory and LISTENs, so
-- a changed secret is read fresh everywhere within moments, and a read costs no round trip
-- while nothing changes. A trigger rather than the adapter's own NOTIFY, so that a change made
-- by hand, or by `plexsphere secrets rekey`, is announced just as surely; TRUNCATE fires no
-- row trigger, so it announces '*'.
CREATE FUNCTION plexsphere.announce_secret_change()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('plexsphere_secret_changed', '*');
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('plexsphere_secret_changed', OLD.domain_id::text || ':' || OLD.name);
    ELSE
        PERFORM pg_notify('plexsphere_secret_changed', NEW.domain_id::text || ':' || NEW.name);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER secrets_announce_change
AFTER INSERT OR UPDATE OR DELETE ON plexsphere.secrets
FOR EACH ROW
EXECUTE FUNCTION plexsphere.announce_secret_change();

CREATE TRIGGER secrets_announce_truncation
AFTER TRUNCATE ON plexsphere.secrets
FOR EACH STATEMENT
EXECUTE FUNCTION plexsphere.announce_secret_change();
