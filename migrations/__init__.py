"""Alembic migrations: the only way Sluice's schema changes."""
