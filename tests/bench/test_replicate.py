"""bench.replicate's figures for a chain: each link's bytes from /proc/net/dev's text, what each
carried between two readings against the 1.05x bound, and the sends it runs (a pair's as before)."""

from pathlib import Path

from bench.replicate import LINK_BOUND, SCRATCH, carried, chain_lines, chain_record, link_bytes, send
from tests.fake_host import site

FIXTURES = Path(__file__).parent / "fixtures"
RAILS = ["enp1s0f1np1", "enP2p1s0f1np1"]
GIB = 1 << 30


def test_a_nodes_link_is_the_sum_of_its_rails_and_nothing_else():
    text = (FIXTURES / "proc_net_dev.txt").read_text()
    assert link_bytes(text, RAILS) == {"rx": 2_000_000_000, "tx": 4_000_000_000}
    assert link_bytes(text, ["enp1s0f1np1"]) == {"rx": 1_100_000_000, "tx": 2_200_000_000}
    assert link_bytes(text, ["absent0"]) == {"rx": 0, "tx": 0}


def readings(**moved: tuple[int, int]) -> tuple[dict, dict]:
    before = {name: {"rx": 5000, "tx": 7000} for name in moved}
    after = {name: {"rx": 5000 + rx, "tx": 7000 + tx} for name, (rx, tx) in moved.items()}
    return before, after


def test_a_chain_where_each_link_carries_the_bytes_once_each_way_is_within_the_bound():
    size = 2 * GIB
    overhead = size // 100  # headers and the control messages
    links = carried(*readings(head=(overhead, size + overhead), w1=(size + overhead, size + overhead),
                              w2=(size + overhead, size + overhead), w3=(size + overhead, overhead)), size)
    assert links["w1"] == {"rx_bytes": size + overhead, "tx_bytes": size + overhead, "rx_vs_model": 1.01, "tx_vs_model": 1.01}
    hops = [{"from": a, "to": b, "seconds": 10.0, "bytes_moved": size} for a, b in (("head", "w1"), ("w1", "w2"), ("w2", "w3"))]
    chain = chain_record(hops, links, 10.0)
    assert chain["seconds"] == 30.0 and chain["time_vs_pair"] == 3.0 and chain["each_link_within_bound"]
    lines = chain_lines(chain, size)
    assert lines[0].startswith("chain to 3 workers: 30.0 s, 3.0x one pair's copy of the same bytes (10.0 s)")
    assert "  w1: out 2068 MiB (1.01x), in 2068 MiB (1.01x)" in lines
    assert lines[-1].startswith("no link carried it twice: each at most 1.01x")


def test_the_head_sending_to_every_worker_is_over_the_bound():
    size = 2 * GIB
    links = carried(*readings(head=(0, 3 * size), w1=(size, 0), w2=(size, 0), w3=(size, 0)), size)
    chain = chain_record([{"from": "head", "to": "w1", "seconds": 5.0, "bytes_moved": size}], links, 5.0)
    assert chain["most_any_link_carried_vs_model"] == 3.0 > LINK_BOUND and not chain["each_link_within_bound"]
    assert "over the 1.05x bound" in chain_lines(chain, size)[-1]


FOUR = site("four")


def test_the_pairs_send_is_as_before_and_a_worker_sends_from_its_copy():
    head, w1, w2, w3 = FOUR.nodes
    programs, scratch = "/var/lib/dual-spark/bin/dual-spark.pyz", f"/var/lib/dual-spark/model/{SCRATCH}"
    pair = (f"python3 {programs} sync send --dir {scratch}/src --manifest {scratch}/manifest.json --peer spark@10.0.0.2,spark@10.0.1.2 "
            f"--local 10.0.0.1,10.0.1.1 --remote-dir {scratch}/sync --remote-state {scratch}/sync-verified.json "
            f"--remote-script {programs} --streams 4")
    assert send(programs, "spark", head, w1, f"{scratch}/src", f"{scratch}/manifest.json", 4, scratch) == pair
    hop = send(programs, "spark", w2, w3, f"{scratch}/sync", "-", 4, scratch)
    assert hop.startswith(f"python3 {programs} sync send --dir {scratch}/sync --manifest - ")
    assert "--peer spark@10.0.0.4,spark@10.0.1.4 --local 10.0.0.3,10.0.1.3 " in hop
