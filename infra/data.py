"""Questions for the search agent: the embedded multi-hop world (the real datasets' loaders:
infra/loaders.py; Cut the Bill's reject-sampling filter of the questions: train.py).

The embedded world is a fictional encyclopedia generated from a seed in seconds: people, cities,
countries, companies and books linked by typed RELATIONS, one passage each, plus distractors one
syllable away from a real name (never asked about). A question follows 1 to 4 relations from a
subject ("where was the founder of the employer of kalo mire born?") and carries its answers, gold
chain and gold queries (each searched entity's name, which BM25 finds first). Names are made of
SYLLABLES and all other words are TEMPLATE_WORDS, so a tokenizer over `vocabulary()` lets a tiny
model copy a name it never saw in training from a passage into its next query.
`claimed` is the lock under which runs sharing an --out_dir write the world (`ensure_world`) and the
warm start one at a time.

Deviations from the papers, each cited by its name (argued in docs/paper_code.md):
- entity-split: the world is split by entity, not by question
"""

import contextlib
import fcntl
import functools
import json
import os
import random
import re
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra import flags

# --------------------------------------------------------------------------------------------------
# The world's alphabet: syllables for names, fixed words for everything else

SYLLABLES = (
    "ka",
    "ke",
    "ki",
    "ko",
    "la",
    "le",
    "lo",
    "lu",
    "mi",
    "mo",
    "ne",
    "ra",
    "re",
    # consonant+vowel: unique split
    "ri",
    "ru",
    "sa",
    "se",
    "su",
    "ta",
    "te",
    "to",
    "va",
    "ve",
    "vo",
    "zu",
)
PUNCTUATION = (".", "?")
KINDS = ("person", "city", "country", "company", "book")
SPLITS = ("corpus", "train", "test", "dev")  # the world's files, {name}.jsonl


@dataclass(frozen=True)
class Relation:
    """A typed, functional relation: every subject of `subject` kind has exactly one object of
    `object` kind."""

    subject: str  # kind of the entity the relation starts from
    # kind of the entity it points to (the answer of a question ending in this relation)
    object: str
    fact: str  # sentence stating the relation in the subject's passage
    noun: str  # noun phrase naming the object through the subject, for the inner hops of a question
    question: str  # question asking for the object, for the last hop


RELATIONS = {
    "born_in": Relation(
        "person", "city", "{s} was born in {o}.", "the birthplace of {s}", "where was {s} born?"
    ),
    "works_for": Relation(
        "person", "company", "{s} works for {o}.", "the employer of {s}", "who does {s} work for?"
    ),
    "founded_by": Relation(
        "company", "person", "{s} was founded by {o}.", "the founder of {s}", "who founded {s}?"
    ),
    "based_in": Relation(
        "company", "city", "{s} is based in {o}.", "the headquarters of {s}", "where is {s} based?"
    ),
    "located_in": Relation(
        "city",
        "country",
        "{s} is located in {o}.",
        "the country of {s}",
        "which country is {s} located in?",
    ),
    "written_by": Relation(
        "book", "person", "{s} was written by {o}.", "the author of {s}", "who wrote {s}?"
    ),
}
KIND_SENTENCE = "{s} is a {kind}."
# syllables per word
NAME_SHAPE = {"person": (2, 2), "city": (3,), "country": (2,), "company": (3,), "book": (3,)}
ANSWER_SUFFIX = {"company": " company"}  # extra accepted answer: "ravoki" or "ravoki company"
_TEMPLATES = [KIND_SENTENCE.format(s="", kind=k) for k in KINDS] + list(ANSWER_SUFFIX.values())
_TEMPLATES += [
    t.format(s="", o="") for r in RELATIONS.values() for t in (r.fact, r.noun, r.question)
]
# every non-name word
TEMPLATE_WORDS = tuple(sorted({w for t in _TEMPLATES for w in re.findall(r"[a-z]+", t)}))


def vocabulary():
    """Every piece the world's text is made of: syllables, template words, punctuation (for a tiny
    tokenizer)."""
    return list(SYLLABLES) + list(TEMPLATE_WORDS) + list(PUNCTUATION)


def syllabify(word):
    """Split a name word into SYLLABLES ("kalo" -> ["ka", "lo"]); None if it is not made of them."""
    pieces = [word[i : i + 2] for i in range(0, len(word), 2)]
    return pieces if len(word) % 2 == 0 and all(p in SYLLABLES for p in pieces) else None


# --------------------------------------------------------------------------------------------------
# Rows: the one question type every loader returns


@dataclass
class QARow:
    """One question with its accepted answers, in Search-R1's row layout plus the world's gold
    chain."""

    id: str  # unique within the dataset (e.g. "test_17")
    question: str  # the question text, without any prompt template
    # every accepted answer string; a prediction is scored against the best-matching one
    golden_answers: list
    data_source: str  # dataset name (Search-R1's `data_source`), e.g. "world", "nq", "hotpotqa"
    split: str  # "train" or "test" (or the source's own split name)
    index: int  # position within its split (Search-R1's `extra_info.index`)
    hops: int = 0  # number of relations between subject and answer; 0 when the source does not say
    # The gold fields are empty when the source has no chain.
    # entity names from the subject to the answer (hops + 1 names)
    gold_chain: list = field(default_factory=list)
    gold_relations: list = field(default_factory=list)  # relation followed at each hop (hops names)
    # per hop, the entity name whose passage holds the next fact
    gold_queries: list = field(default_factory=list)
    # corpus id of the passage each gold query must find
    gold_doc_ids: list = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# The world


@dataclass
class WorldConfig:
    """Sizes and seed of the embedded world (defaults: 4,000 people, hundreds of test questions per
    hop)."""

    seed: int = 0
    """Random seed; the same seed and sizes give byte-identical files."""
    people: int = 4000
    """Number of real people (many entities, few questions each, so a tiny model must search and
    copy)."""
    companies: int = 800
    """Number of real companies."""
    books: int = 1600
    """Number of real books."""
    cities: int = 400
    """Number of real cities."""
    countries: int = 40
    """Number of countries (shared by both sides; never searched)."""
    distractor_fraction: float = 0.3
    """Fraction of real entities (not countries) that get a confusable look-alike passage."""
    test_fraction: float = 0.25
    """Fraction of entities on the test side; test questions only touch those."""
    train_per_hop: int = 2500
    """Train questions per hop count."""
    test_per_hop: int = 500
    """Test questions per hop count."""
    dev_per_hop: int = 100
    """Dev questions per hop: test-side entities, never a test question, drawn after test; the warm
    start's check."""
    max_hops: int = 4
    """Largest hop count; questions have 1..max_hops hops."""


@dataclass
class Entity:
    """One thing in the world, with its passage's facts."""

    name: str  # unique name (syllable words joined by spaces)
    kind: str  # one of KINDS
    side: str  # "train", "test", "shared" (countries) or "distractor"
    facts: dict = field(default_factory=dict)  # relation name -> index of the object entity
    doc_id: str = ""  # corpus id of this entity's passage


@dataclass
class World:
    """A generated world: its entities, corpus rows and question splits."""

    entities: list  # every Entity, distractors included
    # Search-R1 / FlashRAG corpus rows {"id", "contents"}, one per entity, in shuffled order
    corpus: list
    train: list  # train QARows
    test: list  # test QARows
    dev: list  # dev QARows (held out from training and from the test split)


def passage(e, entities):
    """The encyclopedia-style "Title\\ntext" contents of one entity."""
    facts = [RELATIONS[r].fact.format(s=e.name, o=entities[o].name) for r, o in e.facts.items()]
    return e.name + "\n" + " ".join([KIND_SENTENCE.format(s=e.name, kind=e.kind)] + facts)


@functools.cache
def _can_start(kind, hops):
    """Whether some path of `hops` relations starts at an entity of `kind`."""
    return hops == 0 or any(
        _can_start(r.object, hops - 1) for r in RELATIONS.values() if r.subject == kind
    )


def _draw_names(rng, kind, n, owner):
    """n new unique names of `kind`; `owner` maps each name word to the kind that uses it (kept
    disjoint)."""
    names = set()
    for _ in range(50 * n + 1001):
        if len(names) == n:
            return sorted(names)  # sorted: set order is not deterministic across runs
        words = ["".join(rng.choices(SYLLABLES, k=k)) for k in NAME_SHAPE[kind]]
        if all(owner.get(w, kind) == kind and w not in TEMPLATE_WORDS for w in words):
            names.add(" ".join(words))
            owner.update((w, kind) for w in words)
    raise ValueError(
        f"could not draw {n} distinct {kind} names from the syllables; lower the {kind} count"
    )


def _confusable(rng, name, kind, owner, taken):
    """A name one syllable away from `name`, free and not borrowing another kind's words (None if
    none found)."""
    for _ in range(20):
        words = name.split()
        i = rng.randrange(len(words))
        sylls = syllabify(words[i])
        sylls[rng.randrange(len(sylls))] = rng.choice(SYLLABLES)
        words[i] = "".join(sylls)
        new = " ".join(words)
        if (
            new not in taken
            and owner.get(words[i], kind) == kind
            and words[i] not in TEMPLATE_WORDS
        ):
            owner[words[i]] = kind
            return new
    return None


def _pick(rng, by_side_kind, side, kind):
    """A random object of `kind` on `side` (entity-split: relations stay inside a side; countries
    are shared)."""
    pool = by_side_kind.get(("shared" if kind == "country" else side, kind))
    if not pool:
        raise ValueError(
            f"no {kind} on the {side} side; raise the {kind} count or move test_fraction off 0 "
            "and 1"
        )
    return rng.choice(pool)


def build_world(cfg):
    """Generate the world, its corpus and its train/test questions, deterministically from
    `cfg.seed`."""
    rng = random.Random(cfg.seed)
    # by_side_kind: (side, kind) -> indices of the real entities there
    owner, entities, by_side_kind = {}, [], {}
    for kind, n in (
        ("country", cfg.countries),
        ("city", cfg.cities),
        ("company", cfg.companies),
        # fewest first: people reuse the rest
        ("book", cfg.books),
        ("person", cfg.people),
    ):
        for name in _draw_names(rng, kind, n, owner):
            side = (
                "shared"
                if kind == "country"
                else ("test" if rng.random() < cfg.test_fraction else "train")
            )
            by_side_kind.setdefault((side, kind), []).append(len(entities))
            entities.append(Entity(name, kind, side))

    for e in entities:
        e.facts = {
            name: _pick(rng, by_side_kind, e.side, rel.object)
            for name, rel in RELATIONS.items()
            if rel.subject == e.kind
        }
    taken = {e.name for e in entities}
    for e in list(entities):  # confusable look-alikes: never asked about, facts point into e's side
        if e.kind != "country" and rng.random() < cfg.distractor_fraction:
            name = _confusable(rng, e.name, e.kind, owner, taken)
            if name is not None:
                taken.add(name)
                facts = {r: _pick(rng, by_side_kind, e.side, RELATIONS[r].object) for r in e.facts}
                entities.append(Entity(name, e.kind, "distractor", facts))

    order = list(range(len(entities)))
    rng.shuffle(order)  # ids must not reveal kind, side or distractor-ness
    for doc_id, i in enumerate(order):
        entities[i].doc_id = str(doc_id)
    corpus = [{"id": entities[i].doc_id, "contents": passage(entities[i], entities)} for i in order]
    asked = set()  # (subject, relations) already asked: dev never repeats a test question
    train = _questions(rng, entities, "train", "train", cfg.train_per_hop, cfg.max_hops, asked)
    test = _questions(rng, entities, "test", "test", cfg.test_per_hop, cfg.max_hops, asked)
    dev = _questions(rng, entities, "test", "dev", cfg.dev_per_hop, cfg.max_hops, asked)
    return World(entities, corpus, train, test, dev)


def _questions(rng, entities, side, split, per_hop, max_hops, asked):
    """per_hop new questions per hop count 1..max_hops, chains on `side` only, none in `asked`
    (which receives them)."""
    rows = []
    for hops in range(1, max_hops + 1):
        subjects = [
            i for i, e in enumerate(entities) if e.side == side and _can_start(e.kind, hops)
        ]
        if not subjects:
            raise ValueError(
                f"no {side}-side entity can start a {hops}-hop question; move test_fraction away "
                f"from 0 and 1 or enlarge the world"
            )
        seen = set()
        for _ in range(50 * per_hop):
            if len(seen) == per_hop:
                break
            chain, rels = [rng.choice(subjects)], []
            for left in range(hops, 0, -1):  # random relation path that can still run `left` hops
                here = entities[chain[-1]]
                rels.append(
                    rng.choice([r for r in here.facts if _can_start(RELATIONS[r].object, left - 1)])
                )
                chain.append(here.facts[rels[-1]])
            key = (chain[0], tuple(rels))
            if key in seen or key in asked or len(set(chain)) < len(chain):
                # a chain that revisits an entity would need a repeated query, which the rollout
                # stops
                continue
            seen.add(key)
            names = [entities[i].name for i in chain]
            phrase = names[0]
            for r in rels[:-1]:
                phrase = RELATIONS[r].noun.format(s=phrase)
            suffix = ANSWER_SUFFIX.get(entities[chain[-1]].kind)
            rows.append(
                QARow(
                    id=f"{split}_{len(rows)}",
                    question=RELATIONS[rels[-1]].question.format(s=phrase),
                    golden_answers=[names[-1], names[-1] + suffix] if suffix else [names[-1]],
                    data_source="world",
                    split=split,
                    index=len(rows),
                    hops=hops,
                    gold_chain=names,
                    gold_relations=rels,
                    gold_queries=names[:-1],
                    gold_doc_ids=[entities[i].doc_id for i in chain[:-1]],
                )
            )
        if len(seen) < per_hop:
            raise ValueError(
                f"only {len(seen)} distinct {hops}-hop {split} questions could be drawn, "
                f"{per_hop} asked; lower {split}_per_hop or enlarge the world"
            )
        asked |= seen
    return rows


def spread(rows, n):
    """At most n rows taken evenly across `rows` (the world's files are sorted by hops, so all hop
    counts appear)."""
    return rows[:: max(1, len(rows) // n)][:n]


def write_jsonl(path, rows):
    """Write dicts or dataclasses as one JSON object per line."""
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row if isinstance(row, dict) else asdict(row)) + "\n")


@contextlib.contextmanager
def claimed(path, what):
    """Hold an exclusive lock on the file `path` ("PID HOST" of its holder) while `what` is checked
    or written: of two runs sharing an --out_dir, one writes, the other waits (saying for what),
    then finds it written. flock frees the lock when its holder ends, however it ends."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "?"
            print(f"waiting for process {holder} to finish with {what} (lock: {path})", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.truncate(0)
        print(os.getpid(), socket.gethostname(), file=lock, flush=True)
        yield


def ensure_world(out_dir, cfg=None):
    """The embedded world's directory: written from `cfg` (default WorldConfig()) on first use, in
    seconds, under the lock OUT_DIR.lock."""
    with claimed(out_dir.rstrip("/") + ".lock", f"the world {out_dir}"):
        if not all(os.path.exists(os.path.join(out_dir, f"{n}.jsonl")) for n in SPLITS):
            print(f"world: writing the embedded world to {out_dir}")
            write_world(build_world(cfg or WorldConfig()), out_dir)
    return out_dir


def write_world(world, out_dir):
    """Write corpus.jsonl, train.jsonl, test.jsonl and dev.jsonl into out_dir, each complete or not
    at all (written to NAME.tmp, then renamed): a world killed while being written is written again,
    never read half."""
    os.makedirs(out_dir, exist_ok=True)
    for name in SPLITS:
        path = os.path.join(out_dir, f"{name}.jsonl")
        write_jsonl(path + ".tmp", getattr(world, name))
        os.replace(path + ".tmp", path)


if __name__ == "__main__":

    @dataclass
    class Output:
        """Where to write the world."""

        out: str
        """Directory that receives corpus.jsonl, train.jsonl, test.jsonl and dev.jsonl."""

    cfg, output = flags.parse(WorldConfig, Output)
    flags.check(
        cfg,
        [
            (
                "people companies books cities countries train_per_hop test_per_hop max_hops",
                "an integer >= 1",
                lambda v: v >= 1,
            ),
            ("dev_per_hop", "an integer >= 0", lambda v: v >= 0),
            ("distractor_fraction", "in [0, 1]", lambda v: 0 <= v <= 1),
            ("test_fraction", "in (0, 1)", lambda v: 0 < v < 1),
        ],
    )
    print(cfg)
    world = build_world(cfg)
    write_world(world, output.out)
    hops = {h: sum(r.hops == h for r in world.test) for h in range(1, cfg.max_hops + 1)}
    print(
        f"wrote {output.out}: corpus {len(world.corpus)} passages "
        f"({sum(e.side == 'distractor' for e in world.entities)} distractors), "
        f"train {len(world.train)}, test {len(world.test)} (per hop {hops}), dev {len(world.dev)}"
    )
