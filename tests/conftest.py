"""Shared fixtures: a small embedded world and a tiny random policy, written once per test session."""
import pytest

SMALL = dict(people=300, companies=60, books=120, cities=40, countries=10, train_per_hop=20, test_per_hop=5, dev_per_hop=5)


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """A directory holding out/world (a small embedded world) and tiny/ (a freshly initialised tiny policy)."""
    import data
    import policy
    root = tmp_path_factory.mktemp("env")
    data.write_world(data.build_world(data.WorldConfig(**SMALL)), root / "out" / "world")
    tok = policy.world_tokenizer()
    model = policy.tiny_llama(tok, hidden=32, layers=1, heads=2)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    return root
