-- A Domain's name is unique (access crate): two Domains named "acme" could not be told apart
-- by the people who read names (the operator page, the audit log, a walk-through run twice),
-- and `POST /v1/domains` with a name in use now answers 409 naming the Domain that has it.
--
-- Domains that already share a name keep it for the oldest (by created_at, then id); each
-- later one is renamed to its name, cut to 88 characters, followed by " (" and the first eight
-- characters of its id and ")", which fits the 100-character CHECK and tells them apart. The
-- ids, which everything refers to, do not change.
UPDATE plexsphere.domains AS d
SET name = left(d.name, 88) || ' (' || left(d.id::text, 8) || ')'
FROM (
    SELECT id, row_number() OVER (PARTITION BY name ORDER BY created_at, id) AS place
    FROM plexsphere.domains
) AS ranked
WHERE ranked.id = d.id
  AND ranked.place > 1;

ALTER TABLE plexsphere.domains
    ADD CONSTRAINT domains_name_key UNIQUE (name);
