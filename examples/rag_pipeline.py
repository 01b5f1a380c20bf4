"""A RAG pipeline on a local supertable: chunk, embed, write, then retrieve.

Run ``python -m examples.rag_pipeline`` (or ``python examples/rag_pipeline.py``)
from the repository root. It writes the table under ``out/rag_chunks`` and
prints each question with the chunks retrieved for it.

The chunks are upserted by id, so a rerun replaces the example's chunks in
place: the table keeps one row per chunk id and nothing is deleted. A
``--table`` path that holds something else (not a supertable, or a table of
another schema) is refused, and left as it is.

Nothing is downloaded: ``embed`` hashes words into a fixed-size unit vector
(feature hashing), a stand-in for a real model. In a real pipeline the
embedding step is Beam's ``MLTransform`` with a HuggingFace or Vertex AI
embedding, and only the dimension changes here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional

import numpy as np
import pyarrow as pa

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Beam is imported where it is used, once --table is checked: importing it can
# log (optional filesystems it cannot load), and a refusal prints one line.
from beam_supertable import Supertable  # noqa: E402 - imports no Beam
from beam_supertable.jobs._launch import quiet_logging  # noqa: E402 - imports no Beam

if TYPE_CHECKING:
    from apache_beam.ml.rag.types import Chunk

DIM = 32
DEFAULT_TABLE = os.path.join("out", "rag_chunks")
METADATA_FIELDS = [pa.field("document", pa.string())]
# The chunk table's columns (beam_supertable.rag.chunk_schema) for these fields.
CHUNK_COLUMNS = ["id", "content", "embedding", "metadata"] + [f.name for f in METADATA_FIELDS]

DOCUMENTS = {
    "cats": ("Cats sleep most of the day. A cat grooms its fur with its rough tongue. "
             "Kittens learn to hunt by playing with their siblings."),
    "rockets": ("A rocket carries fuel and oxidizer to burn in space. Satellites reach orbit "
                "on a rocket launch. The moon landing used a rocket with three stages."),
    "bread": ("Bread dough rises because yeast makes gas. Bakers knead the dough to build "
              "gluten. Sourdough bread uses a starter instead of dry yeast."),
    "tides": ("Tides rise and fall because the moon pulls on the oceans. Spring tides "
              "happen when the sun and the moon line up."),
}

QUESTIONS = ["why does bread dough rise", "what pulls the oceans", "how do kittens learn to hunt"]


def embed(text: str, dim: int = DIM) -> List[float]:
    """Signed feature hashing of the words, scaled to unit length.

    blake2b, not ``hash()``: the same word lands in the same bucket in every
    worker process.
    """
    v = np.zeros(dim)
    for word in re.findall(r"\w+", text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        v[h % dim] += 1.0 if (h >> 40) & 1 else -1.0
    norm = np.linalg.norm(v)
    return (v / norm if norm else v).tolist()


def chunk_document(name: str, text: str) -> Iterable[Chunk]:
    """One chunk per sentence, with the document name as filterable metadata."""
    from apache_beam.ml.rag.types import Chunk, Content

    for i, sentence in enumerate(s.strip() for s in re.split(r"(?<=\.)\s+", text)):
        if sentence:
            yield Chunk(content=Content(text=sentence), id=f"{name}-{i}", index=i,
                        metadata={"document": name, "position": i})


def with_embedding(chunk: Chunk) -> Chunk:
    from apache_beam.ml.rag.types import Embedding

    chunk.embedding = Embedding(dense_embedding=embed(chunk.content.text))
    return chunk


def question(text: str, i: int) -> Chunk:
    from apache_beam.ml.rag.types import Chunk, Content, Embedding

    return Chunk(content=Content(text=text), id=f"question-{i}",
                 embedding=Embedding(dense_embedding=embed(text)))


def table_problem(table: str) -> Optional[str]:
    """Why ``--table`` cannot be written by this example, or None when it can.

    It can when nothing is there yet, or when it holds this example's chunk
    table (keyed by id: a rerun replaces the chunks).
    """
    if not os.path.lexists(table):
        return None
    if not os.path.isdir(table):
        return f"{table} exists and is not a supertable"
    try:
        existing = Supertable.open(table)
    except FileNotFoundError:
        return f"{table} exists and is not a supertable"
    vector = existing.properties.get("vector") or {}
    if existing.user_schema.names != CHUNK_COLUMNS or vector.get("column") != "embedding" \
            or vector.get("dim") != DIM:
        return f"{table} is a supertable of another schema, not this example's chunk table"
    if existing.primary_key != ["id"]:
        return (f"{table} is a chunk table without a primary key (an older version of this "
                "example wrote it); rerunning would store every chunk again")
    return None


def ingest(table: str) -> None:
    import apache_beam as beam

    from beam_supertable.rag import SupertableVectorWriterConfig

    config = SupertableVectorWriterConfig(table, dimension=DIM, metadata_fields=METADATA_FIELDS)
    with beam.Pipeline() as p:
        _ = (p
             | "Documents" >> beam.Create(sorted(DOCUMENTS.items()))
             | "Chunk" >> beam.FlatMapTuple(chunk_document)
             | "Embed" >> beam.Map(with_embedding)
             | "Write" >> config.create_write_transform())


def retrieve(table: str, questions: List[str], k: int, mode: str) -> Dict[str, List[str]]:
    import apache_beam as beam

    from beam_supertable import rag
    from beam_supertable.rag import EnrichWithSupertable, SupertableSearchEnrichmentHandler

    handler = SupertableSearchEnrichmentHandler(table, mode=mode, k=k,
                                                columns=["content", "document"])
    # Beam's Enrichment when its dependencies (google-api-core) are installed;
    # otherwise the same search and join without them.
    search = (rag.Enrichment(handler, join_fn=handler.join_fn) if rag.Enrichment is not None
              else EnrichWithSupertable(handler))
    answers: Dict[str, List[str]] = {}
    # The few answers come back to this process through a file of its own.
    scratch = tempfile.mkdtemp(prefix="rag_answers_")
    path = os.path.join(scratch, "answers.jsonl")
    with beam.Pipeline() as p:
        found = (p
                 | "Questions" >> beam.Create([question(q, i) for i, q in enumerate(questions)])
                 | "Search" >> search
                 | "Answers" >> beam.Map(lambda c: (c.content.text, [
                     f["content"] for f in c.metadata[rag.ENRICHMENT_KEY]["fields"]])))
        _ = (found | beam.Map(json.dumps)
             | beam.io.WriteToText(path, shard_name_template=""))
    try:
        with open(path) as f:
            for line in f:
                q, got = json.loads(line)
                answers[q] = got
    finally:
        shutil.rmtree(scratch)  # made by this run, above
    return answers


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def run(argv: Optional[List[str]] = None) -> Dict[str, List[str]]:
    parser = argparse.ArgumentParser(prog="python -m examples.rag_pipeline", description=__doc__)
    parser.add_argument("--table", default=DEFAULT_TABLE, help="default: %(default)s")
    parser.add_argument("--k", type=_positive_int, default=2, help="chunks per question")
    parser.add_argument("--mode", default="hybrid", choices=("vector", "text", "hybrid"))
    args = parser.parse_args(argv)
    quiet_logging()   # Beam's import-time messages, as the jobs hide them
    problem = table_problem(args.table)
    if problem is not None:
        print(f"rag_pipeline: refusing --table: {problem}", file=sys.stderr)
        sys.exit(1)
    os.makedirs(os.path.dirname(os.path.abspath(args.table)), exist_ok=True)
    ingest(args.table)
    answers = retrieve(args.table, QUESTIONS, args.k, args.mode)
    for q in QUESTIONS:
        print(f"Q: {q}")
        for text in answers[q]:
            print(f"   - {text}")
    return answers


if __name__ == "__main__":
    run()
