"""Admission webhooks served by every operator replica: pods (budget + quota), CR checks."""
