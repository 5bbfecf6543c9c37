"""What each Celery pool child sets up for itself when it starts."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from config.celery import _share_the_cores


@pytest.fixture
def omp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # this process's threads stay
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))


@pytest.mark.parametrize(("children", "threads"), [(1, 8), (2, 4), (3, 2), (16, 1)])
def test_each_child_gets_the_cores_divided_among_the_children(
    omp: None, settings: Any, children: int, threads: int
) -> None:
    settings.CELERY_WORKER_CONCURRENCY, settings.WORKER_CHILD_THREADS = children, 0
    _share_the_cores()
    assert os.environ["OMP_NUM_THREADS"] == str(threads)


def test_threads_set_by_the_operator_win(omp: None, settings: Any) -> None:
    settings.CELERY_WORKER_CONCURRENCY, settings.WORKER_CHILD_THREADS = 2, 3
    _share_the_cores()
    assert os.environ["OMP_NUM_THREADS"] == "3"
