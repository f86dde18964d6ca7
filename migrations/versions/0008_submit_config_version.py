"""submit_config: one row whose version changes, at the commit, with every change to what Submit
validates a job against (the service classes' names and priorities, the queues' names and documents,
the clusters' names, tiers, sites, labels, documents and allocatable capacity). A small write checks
that version is still the one it validated against (submitting.Submitter._write_at_once) instead of
building and hashing all of those, which cost Postgres about 150 us of CPU a write with 3 clusters and
1,060 us with 100 (the write itself about 250 us).

The triggers are deferred constraint triggers: a transaction takes the version row's lock at its
commit, after every other lock it takes, so two transactions can wait for each other's bump but never in
a cycle (a cluster's heartbeat holding its row while waiting for the version, and an admin's apply
holding the version while waiting for that row, would deadlock). A heartbeat that changes only free
capacity bumps nothing.

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

_ALLOCATABLE = ("CASE WHEN {t}.capacity IS NULL OR {t}.capacity = '{{}}' THEN NULL "
                "ELSE coalesce({t}.capacity -> 'allocatable', '{{}}') END")
# table -> the columns whose change matters to Submit (UPDATE; any INSERT or DELETE matters)
WATCHED = {
    "service_classes": ("(OLD.name, OLD.priority)", "(NEW.name, NEW.priority)"),
    "queues": ("(OLD.name, OLD.spec)", "(NEW.name, NEW.spec)"),
    "clusters": (f"(OLD.name, OLD.tier, OLD.site, OLD.labels, OLD.spec, {_ALLOCATABLE.format(t='OLD')})",
                 f"(NEW.name, NEW.tier, NEW.site, NEW.labels, NEW.spec, {_ALLOCATABLE.format(t='NEW')})"),
}


def upgrade() -> None:
    op.create_table('submit_config',
                    sa.Column('id', sa.Integer(), autoincrement=False, nullable=False),
                    sa.Column('version', sa.BigInteger(), server_default='0', nullable=False),
                    sa.PrimaryKeyConstraint('id'))
    op.execute("INSERT INTO submit_config (id) VALUES (1)")
    op.execute("""CREATE FUNCTION submit_config_changed() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN UPDATE submit_config SET version = version + 1 WHERE id = 1; RETURN NULL; END $$""")
    for table, (old, new) in WATCHED.items():
        op.execute(f"""CREATE CONSTRAINT TRIGGER {table}_submit_config AFTER INSERT OR DELETE ON {table}
                       DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION submit_config_changed()""")
        op.execute(f"""CREATE CONSTRAINT TRIGGER {table}_submit_config_update AFTER UPDATE ON {table}
                       DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({old} IS DISTINCT FROM {new})
                       EXECUTE FUNCTION submit_config_changed()""")
        op.execute(f"""CREATE TRIGGER {table}_submit_config_truncate AFTER TRUNCATE ON {table}
                       FOR EACH STATEMENT EXECUTE FUNCTION submit_config_changed()""")


def downgrade() -> None:
    for table in WATCHED:
        for suffix in ("", "_update", "_truncate"):
            op.execute(f"DROP TRIGGER {table}_submit_config{suffix} ON {table}")
    op.execute("DROP FUNCTION submit_config_changed()")
    op.drop_table('submit_config')
