"""Tenants, end users and runs."""
