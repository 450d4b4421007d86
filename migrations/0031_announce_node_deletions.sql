-- A deleted Node (a revoked credential) is announced on the channel plexsphere_node_revoked,
-- with the Node's id as the payload, when the deleting transaction commits (NOTIFY is
-- transactional). Every replica LISTENs and drops the Node from its cache of authenticated
-- credentials, so a revoked token stops working everywhere within moments, not when a cache
-- entry expires. A trigger rather than the adapter's own NOTIFY, so that an operator deleting
-- rows by hand revokes just as surely; TRUNCATE fires no row trigger, so it announces '*'.
CREATE FUNCTION plexsphere.announce_node_deletion()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('plexsphere_node_revoked', '*');
    ELSE
        PERFORM pg_notify('plexsphere_node_revoked', OLD.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER nodes_announce_deletion
AFTER DELETE ON plexsphere.nodes
FOR EACH ROW
EXECUTE FUNCTION plexsphere.announce_node_deletion();

CREATE TRIGGER nodes_announce_truncation
AFTER TRUNCATE ON plexsphere.nodes
FOR EACH STATEMENT
EXECUTE FUNCTION plexsphere.announce_node_deletion();
