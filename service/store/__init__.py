"""The store: engine and sessions, ORM tables, and every SQL statement, per table or concern."""
