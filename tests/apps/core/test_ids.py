"""Primary keys taken ahead of their rows (apps.core.ids): from the table's own sequence,
so keys taken and keys the database assigns never collide."""

from __future__ import annotations

import threading

import pytest

from apps.chat.models import Conversation
from apps.core.ids import KeyBlock, keys_allocate
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def test_taken_keys_are_never_assigned_by_an_insert() -> None:
    team = factories.team(name="keys")
    before = Conversation.objects.create(team=team)
    taken = keys_allocate(Conversation, count=5)
    assert len(set(taken)) == 5
    assert min(taken) > before.pk
    after = Conversation.objects.create(team=team)
    assert after.pk not in taken
    assert after.pk > max(taken)
    explicit = Conversation.objects.create(pk=taken[0], team=team)
    assert explicit.pk == taken[0]


def test_a_table_with_no_insert_yet() -> None:
    taken = keys_allocate(Conversation, count=3)
    assert len(set(taken)) == 3
    row = Conversation.objects.create(team=factories.team(name="keys"))
    assert row.pk not in taken


def test_concurrent_allocations_are_disjoint() -> None:
    from django.db import connection

    results: list[list[int]] = []

    def allocate() -> None:
        try:
            for _ in range(5):
                results.append(keys_allocate(Conversation, count=4))
        finally:
            connection.close()

    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keys = [key for block in results for key in block]
    assert len(keys) == 80
    assert len(set(keys)) == 80


async def test_a_block_hands_out_keys_in_order_and_refills() -> None:
    block = KeyBlock(Conversation, size=3)
    keys = [await block.take() for _ in range(7)]
    assert len(set(keys)) == 7
    assert keys == sorted(keys)
