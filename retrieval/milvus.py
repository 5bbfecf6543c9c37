"""Chunks in Milvus: dense and BM25 search inside an engine, past one machine.

One engine collection holds every chunk embedded by one model, all teams together; the
``scope`` field (``"<team>.<collection>"``) is its partition key, so a search that names
its scopes reads only their partitions, and every search also filters on ``team`` inside
the engine. The keyword side is Milvus's BM25 function over a sparse field, fed the
product's own analysed terms (:func:`retrieval.analysis.keyword_tokens`: stop words out,
Snowball stems), so both backends rank words alike.

``MilvusClient`` talks to Milvus Lite (a ``.db`` path: the engine inside this process;
``milvus-lite server``: one shared by many) and to a Milvus standalone or cluster
(``http://host:19530``) with the same calls. Nothing here imports Django.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pymilvus import DataType, Function, FunctionType, MilvusClient, MilvusException

from retrieval.analysis import KeywordQuery, keyword_tokens
from retrieval.bm25 import BM25Parameters
from retrieval.hits import Hit
from retrieval.index import HNSW_BEAM, HNSW_NEIGHBOURS, Ids, Vectors

logger = logging.getLogger(__name__)

MAX_TERMS_BYTES = 65_535  # a VARCHAR field's limit
WRITE_BATCH = 1_000
READ_BATCH = 10_000
# The most one search may return (Milvus's maxTopK, the same bound on an HNSW ef): a deeper
# read (SEARCH_FUSION_DEPTH past it) is answered this deep, not refused.
MAX_TOP_K = 16_384
# What Milvus answers a read of a collection not loaded for search (released).
COLLECTION_NOT_LOADED = 101
# Reads after writes from any process: a search sees every write acknowledged before it.
CONSISTENCY = "Strong"
INDEX_PARAMS: dict[str, dict[str, Any]] = {
    "FLAT": {},
    "HNSW": {"M": HNSW_NEIGHBOURS, "efConstruction": 200},
    "IVF_FLAT": {"nlist": 1024},
    "AUTOINDEX": {},
}


@dataclass(frozen=True, slots=True)
class Scope:
    """One team's collection: the partition key of its chunks."""

    team: int
    collection: int

    def __str__(self) -> str:
        return f"{self.team}.{self.collection}"


@dataclass(frozen=True)
class Where:
    """Which chunks a search may return: those of ``scopes`` (one team's collections),
    of ``team`` itself, and, where the caller's filters say, of ``documents`` only (the
    filters select whole documents: a few ids where chunk ids could be millions)."""

    team: int
    scopes: Sequence[Scope]
    documents: Ids | None = None

    @property
    def empty(self) -> bool:
        return not self.scopes or (self.documents is not None and not len(self.documents))

    def expression(self) -> str:
        """The engine's filter: the scopes first (partition pruning), then the team, then
        the documents; every value an int or a scope made of ints."""
        names = ", ".join(f'"{scope}"' for scope in sorted({str(s) for s in self.scopes}))
        expression = f"scope in [{names}] and team == {int(self.team)}"
        if self.documents is not None:
            listed = ", ".join(str(int(pk)) for pk in np.unique(self.documents))
            expression += f" and document in [{listed}]"
        return expression


@dataclass(frozen=True)
class MilvusRows:
    """Chunks to write: ids, their vectors, the text to index for keywords, and where
    each belongs."""

    ids: Ids
    vectors: Vectors
    texts: Sequence[str]
    scope: Scope
    documents: Sequence[int]


class MilvusIndex:
    """One engine collection of chunks (one embedding model), made on first use."""

    def __init__(
        self,
        uri: str,
        *,
        name: str,
        dimension: int,
        token: str = "",
        index: str = "HNSW",
        bm25: BM25Parameters | None = None,
    ) -> None:
        if index not in INDEX_PARAMS:
            raise ValueError(f"unknown Milvus index {index!r}: one of {sorted(INDEX_PARAMS)}")
        self.uri, self.name, self.dimension, self.index = uri, name, dimension, index
        self.bm25 = bm25 or BM25Parameters()
        self.client = MilvusClient(uri=uri, token=token)
        self._ready = False

    # Schema ------------------------------------------------------------------------------

    def ensure(self) -> None:
        """Make the collection if it does not exist, and load it for search."""
        if self._ready:
            return
        if not self.client.has_collection(self.name):
            self.client.create_collection(
                self.name, schema=self._schema(), index_params=self._index_params()
            )
            logger.info("milvus: made collection %s (%s)", self.name, self.index)
        self.client.load_collection(self.name)
        self._ready = True

    def _schema(self) -> Any:
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("scope", DataType.VARCHAR, max_length=64, is_partition_key=True)
        schema.add_field("team", DataType.INT64)
        schema.add_field("collection", DataType.INT64)
        schema.add_field("document", DataType.INT64)
        schema.add_field(
            "terms",
            DataType.VARCHAR,
            max_length=MAX_TERMS_BYTES,
            enable_analyzer=True,
            analyzer_params={"tokenizer": "standard"},  # the terms come analysed
        )
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_field("dense", DataType.FLOAT_VECTOR, dim=self.dimension)
        schema.add_function(
            Function(
                name="bm25",
                function_type=FunctionType.BM25,
                input_field_names=["terms"],
                output_field_names=["sparse"],
            )
        )
        return schema

    def _index_params(self) -> Any:
        params = self.client.prepare_index_params()
        params.add_index(
            "dense", index_type=self.index, metric_type="IP", params=INDEX_PARAMS[self.index]
        )
        params.add_index(
            "sparse",
            index_type="SPARSE_INVERTED_INDEX",
            metric_type="BM25",
            params={"bm25_k1": self.bm25.k1, "bm25_b": self.bm25.b},
        )
        return params

    # Writing -----------------------------------------------------------------------------

    def upsert(self, rows: MilvusRows) -> int:
        """Write the chunks (a chunk written before is replaced, so a re-delivered write
        adds nothing twice); returns how many."""
        self.ensure()
        records = [
            {
                "id": int(pk),
                "scope": str(rows.scope),
                "team": rows.scope.team,
                "collection": rows.scope.collection,
                "document": int(document),
                "terms": analysed_terms(text),
                "dense": vector.tolist(),
            }
            for pk, vector, text, document in zip(
                rows.ids, rows.vectors, rows.texts, rows.documents, strict=True
            )
        ]
        for start in range(0, len(records), WRITE_BATCH):
            self.client.upsert(self.name, records[start : start + WRITE_BATCH])
        return len(records)

    def delete(self, ids: Iterable[int]) -> None:
        wanted = [int(pk) for pk in ids]
        if not wanted:
            return
        self.ensure()
        for start in range(0, len(wanted), WRITE_BATCH):
            self.client.delete(self.name, ids=wanted[start : start + WRITE_BATCH])

    def drop_scope(self, scope: Scope) -> None:
        """Delete every chunk of the scope (its collection was deleted)."""
        self.ensure()
        self.client.delete(self.name, filter=f'scope == "{scope}"')

    # Reading -----------------------------------------------------------------------------

    def dense_search(self, query: Vectors, k: int, where: Where) -> list[Hit]:
        """The ``k`` chunks ``where`` allows nearest to ``query`` (cosine), best first."""
        vector = np.asarray(query, dtype=np.float32).reshape(-1).tolist()
        search = {"metric_type": "IP", "params": self._search_params(min(k, MAX_TOP_K))}
        return self._search([vector], "dense", search, k, where)

    def keyword_search(self, query: KeywordQuery, k: int, where: Where) -> list[Hit]:
        """BM25 over the chunks ``where`` allows, best first; each query term as often as
        it was used."""
        text = " ".join(
            " ".join([term] * count) for term, count in zip(query.terms, query.counts, strict=True)
        )
        if not text:
            return []
        return self._search([text], "sparse", {"metric_type": "BM25"}, k, where)

    def _search(
        self, data: list[Any], field: str, params: dict[str, Any], k: int, where: Where
    ) -> list[Hit]:
        if where.empty or k <= 0:
            return []
        self.ensure()
        found = self._reading(
            self.client.search,
            self.name,
            data=data,
            anns_field=field,
            limit=min(k, MAX_TOP_K),  # a deeper read is answered this deep
            filter=search_filter(where),
            output_fields=["id"],
            search_params=params,
            consistency_level=CONSISTENCY,
        )
        # A BM25 score is positive; Milvus Lite answers its negation as a distance.
        hits = [Hit(int(row["id"]), abs(float(row["distance"]))) for row in found[0]]
        hits.sort(key=lambda hit: (-hit.score, hit.id))
        return hits

    def _reading(self, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``read``, after loading the collection again if the engine released it (Milvus
        Lite does on a restart; a standalone Milvus when an operator releases it)."""
        try:
            return read(*args, **kwargs)
        except MilvusException as exc:
            if exc.code != COLLECTION_NOT_LOADED:
                raise
            logger.info("milvus: %s was released; loading it again", self.name)
            self._ready = False
            self.ensure()
            return read(*args, **kwargs)

    def _search_params(self, k: int) -> dict[str, Any]:
        if self.index == "HNSW":
            return {"ef": max(HNSW_BEAM, k)}
        if self.index == "IVF_FLAT":
            return {"nprobe": 64}
        return {}

    def ids(self, scope: Scope) -> Ids:
        """Every chunk id the engine holds for ``scope``."""
        return _as_ids(self._query_ids(f'scope == "{scope}"'))

    def scopes_except(self, live: Iterable[Scope]) -> set[Scope]:
        """The scopes with chunks in the engine that are not among ``live`` (collections
        deleted while the engine could not be reached)."""
        kept = sorted({str(scope) for scope in live})
        expression = f"scope not in {kept!r}".replace("'", '"') if kept else ""
        self.ensure()
        found: set[Scope] = set()
        iterator = self._reading(
            self.client.query_iterator,
            self.name,
            batch_size=READ_BATCH,
            filter=expression,
            output_fields=["team", "collection"],
            consistency_level=CONSISTENCY,
        )
        for batch in _batches(iterator):
            found.update(Scope(int(row["team"]), int(row["collection"])) for row in batch)
        return found

    def _query_ids(self, expression: str) -> list[int]:
        self.ensure()
        iterator = self._reading(
            self.client.query_iterator,
            self.name,
            batch_size=READ_BATCH,
            filter=expression,
            output_fields=["id"],
            consistency_level=CONSISTENCY,
        )
        return [int(row["id"]) for batch in _batches(iterator) for row in batch]

    def count(self) -> int:
        self.ensure()
        rows = self._reading(
            self.client.query,
            self.name,
            filter="",
            output_fields=["count(*)"],
            consistency_level=CONSISTENCY,
        )
        return int(rows[0]["count(*)"])

    def drop(self) -> None:
        """Delete the whole engine collection (tests, benches)."""
        if self.client.has_collection(self.name):
            self.client.drop_collection(self.name)
        self._ready = False

    def close(self) -> None:
        self.client.close()


def analysed_terms(text: str) -> str:
    """``text`` as the keyword side indexes it: its analysed terms, space-separated, cut
    to what a VARCHAR holds (at a term's end)."""
    terms = " ".join(keyword_tokens([text])[0])
    if len(terms.encode()) <= MAX_TERMS_BYTES:
        return terms
    cut = terms.encode()[:MAX_TERMS_BYTES].decode(errors="ignore")
    return cut[: cut.rfind(" ")] if " " in cut else cut


def search_filter(where: Where) -> str:
    """The filter a search sends (one place, so that a test can see what the engine gets)."""
    return where.expression()


def _batches(iterator: Any) -> Iterator[list[dict[str, Any]]]:
    try:
        while batch := iterator.next():
            yield batch
    finally:
        iterator.close()


def _as_ids(ids: list[int]) -> Ids:
    return np.unique(np.asarray(ids, dtype=np.int64))
