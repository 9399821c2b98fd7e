"""Properties of the NCCL log parser: it never raises, its output is always
JSON, it is deterministic, and prefixes in front of NCCL lines do not change
what it reads.  Hypothesis feeds it arbitrary text and mutated real lines."""

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nccl.diagnosis import diagnose
from nccl.parser import format_summary_text, parse_nccl_log, parse_nccl_text
from nccl.patterns import HEADER

LOG_DIR = Path(__file__).resolve().parents[1] / "data" / "nccl-logs"
REAL_LINES = [line for path in sorted(LOG_DIR.glob("*.log")) for line in path.read_text(encoding="utf-8").splitlines()]
# Lines with an NCCL header and no launcher prefix, so a prefix we add is the only one.
HEADER_LINES = [
    line
    for line in REAL_LINES
    if (m := HEADER.search(line))
    and " " not in line[: m.start()]
    and "<stdout>" not in line
    and not line.startswith((">", "2025", "("))
]
# Facts read from NCCL header lines; a prefix must not change them.
HEADER_FACTS = (
    "version",
    "nranks",
    "hosts",
    "process_count",
    "ranks",
    "transports",
    "transport_counts",
    "net",
    "ib_devices",
    "bootstrap_interfaces",
    "socket_interfaces",
    "init_complete",
    "communicators",
    "error_codes",
    "rings",
    "trees",
    "nccl_line_count",
    "unparsed",
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_summary(summary) -> dict:
    data = summary.to_dict()
    assert data["unparsed"]["parser_errors"] == 0, data["unparsed"]["examples"]
    assert json.loads(json.dumps(data)) == data
    assert isinstance(format_summary_text(summary), str)
    for promise in ("none", "socket", "ib", "roce"):
        diagnose(summary, promised_network=promise, node_count=2, expected_ranks=8)
    return data


@FAST
@given(st.text())
def test_arbitrary_text_never_raises(text):
    check_summary(parse_nccl_text(text))


@FAST
@given(st.lists(st.one_of(st.text(max_size=200), st.binary(max_size=200)), max_size=30))
def test_arbitrary_lines_and_bytes_never_raise(lines):
    data = check_summary(parse_nccl_log(lines))
    assert data["line_count"] == len(lines)


@st.composite
def mutated_real_lines(draw):
    lines = draw(st.lists(st.sampled_from(REAL_LINES), min_size=1, max_size=20))
    mutated = []
    for line in lines:
        cut = draw(st.integers(0, len(line)))
        kind = draw(st.sampled_from(["cut", "insert", "delete", "replace", "keep", "splice"]))
        if kind == "cut":
            line = line[:cut]
        elif kind == "insert":
            line = line[:cut] + draw(st.text(max_size=12)) + line[cut:]
        elif kind == "delete":
            line = line[:cut] + line[cut + draw(st.integers(1, 20)) :]
        elif kind == "replace" and line:
            line = line[:cut] + draw(st.characters()) + line[cut + 1 :]
        elif kind == "splice":
            line = line[:cut] + draw(st.sampled_from(REAL_LINES))
        mutated.append(line)
    return mutated


@FAST
@given(mutated_real_lines())
def test_mutated_and_cut_real_lines_never_raise(lines):
    check_summary(parse_nccl_log(lines))


@FAST
@given(mutated_real_lines())
def test_parsing_is_deterministic_and_text_equals_lines(lines):
    lines = [line.replace("\r", "") for line in lines]
    first = parse_nccl_log(lines).to_dict()
    assert parse_nccl_log(lines).to_dict() == first
    if all("\n" not in line for line in lines):
        assert parse_nccl_text("".join(line + "\n" for line in lines)).to_dict() == first


PREFIX = st.one_of(
    st.text(
        alphabet=st.characters(
            blacklist_characters=":\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u20290123456789", blacklist_categories=("Cs",)
        ),
        max_size=30,
    ).map(lambda s: s + " "),
    st.integers(0, 512).map(lambda n: f"[1,{n}]<stdout>:"),
    st.integers(1, 99999).map(lambda n: f"(WorkerDict pid={n}) "),
    st.sampled_from(["> ", "> > > ", "2025-11-12 20:41:43,851 - INFO - ", "`"]),
)


@FAST
@given(st.lists(st.sampled_from(HEADER_LINES), min_size=1, max_size=25), st.data())
def test_prefixes_do_not_change_what_is_read(lines, data):
    prefixed = [data.draw(PREFIX) + line for line in lines]
    plain, noisy = parse_nccl_log(lines).to_dict(), parse_nccl_log(prefixed).to_dict()
    for key in HEADER_FACTS:
        if key == "unparsed":
            assert noisy[key]["count"] == plain[key]["count"]
        else:
            assert noisy[key] == plain[key], key
    # An mpirun tag adds the launcher's rank to a warning; the warning itself is the same.
    assert [w["message"] for w in noisy["warning_details"]] == [w["message"] for w in plain["warning_details"]]


@FAST
@given(
    st.lists(st.sampled_from(REAL_LINES), max_size=40),
    st.lists(
        st.text(
            alphabet=st.characters(
                blacklist_characters="N\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", blacklist_categories=("Cs",)
            ),
            max_size=60,
        ),
        max_size=40,
    ),
)
def test_interleaved_program_output_is_ignored(nccl_lines, other_lines):
    """Lines without "NCCL" or "nccl" in them never change the summary."""
    other_lines = [
        line for line in other_lines if "ncc" not in line.lower() and "Pid" not in line and "Last error" not in line
    ]
    mixed = [line for pair in zip(nccl_lines, other_lines, strict=False) for line in pair]
    mixed += nccl_lines[len(other_lines) :]
    assert len(mixed) >= len(nccl_lines)
    plain = parse_nccl_log([line for line in mixed if line in nccl_lines or line in REAL_LINES]).to_dict()
    noisy = parse_nccl_log(mixed).to_dict()
    plain.pop("line_count"), noisy.pop("line_count")
    assert noisy == plain


# Messages the parser reads field by field, with every field left open to odd values.
TEMPLATES = [
    "Channel {}/{} : {}[{}] -> {}[{}] [{}] via NET/{}/{}{}",
    "Ring {} : {} -> {} -> {}",
    "Channel {}/{} :   {} {} {}",
    "Trees [{}] {}/{}/{}->{}->{}",
    "comm {} rank {} nranks {} cudaDev {} nvmlDev {} busId {} commId {} - Init {}",
    "comm {} rank {} nRanks {} nNodes {} localRanks {} localRank {} MNNVL {}",
    "rank {} nranks {}",
    "Init timings: rank {} nranks {} total {}",
    "NET/IB : Using [{}]{}:{}/{} [{}]{}; OOB {}:{}<{}>",
    "Bootstrap : Using {}:{}<{}>",
    "NET/Socket : Using [{}]{}:{}<{}>",
    "cudaDriverVersion {}",
    "{} coll channels, {} collnet channels, {} nvls channels, {} p2p channels",
    "NCCL version {}.{}.{}+cuda{}",
    "{}:{} -> {}",
    "Using network {}",
    "NCCL_{} set by environment to {}",
    "CUDA Dev {}, IB Ports : {}/{}({})",
    "Call to connect returned {}, retrying",
    "Sharp rank {}/{} initialized on {}",
    "=== System : maxBw {} ===",
    "{} - GPU/{} ({})",
]
ODD_VALUE = st.one_of(
    st.integers(-3, 10**7).map(str),
    st.sampled_from(["²", "٣", "0x1f", "-1", "", "(nil)", "1e3", "ffff", "IB", "RoCE", "send", "receive", "START"]),
    st.text(max_size=6),
)


@st.composite
def templated_lines(draw):
    template = draw(st.sampled_from(TEMPLATES))
    values = [draw(ODD_VALUE) for _ in range(template.count("{}"))]
    level = draw(st.sampled_from(["INFO", "INFO", "WARN", "TRACE"]))
    source = "misc/x.cc:12 " if level == "WARN" else ""
    return (
        f"host-{draw(st.integers(0, 3))}:{draw(st.integers(1, 9))}:7 [{draw(st.integers(0, 7))}] {source}NCCL {level} "
        + (template.format(*values))
    )


@FAST
@given(st.lists(templated_lines(), min_size=1, max_size=30))
def test_odd_values_in_known_messages_never_break_the_parser(lines):
    check_summary(parse_nccl_log(lines))
