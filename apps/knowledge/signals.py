"""What the knowledge app tells the apps above it, which it may not import."""

from __future__ import annotations

from django.dispatch import Signal

team_documents_deleted = Signal()
"""Sent with ``team_id`` once the deletion of some of a team's documents has committed:
answers quoting them must not stay readable (the chat app drops the team's cached
answers)."""
