"""Database helpers under everything: SQL statements, the database clock, the failure boundary."""
