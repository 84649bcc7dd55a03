"""Alembic migrations: the only owner of the database schema."""
