"""Following mpirun's output files by byte offset: a reader that resumes from a stored cursor, in another
process, gives exactly the lines a single reader would have given (none missing, none doubled)."""

import json
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.runtime.launcher import FollowedFile

PLAN = SimpleNamespace(rank_workers=(0, 0, 1, 1))

# Tagged pieces as mpirun writes them, split lines and interleaved ranks included, with text that is
# not ASCII (a cut inside a character must not lose or double it).
OUTPUT = (
    "[1,0]<stdout>:step 1 loss=0.5\n"
    "[1,1]<stdout>:héllo wörld ✓\n"
    "[1,2]<stdout>:half[1,3]<stdout>:other rank\n"
    "[1,2]<stdout>: a line in two writes\n"
    "mpirun's own words before any tag\n"
    "[1,3]<stderr>:Traceback (most recent call last):\n"
    "[1,0]<stdout>:末尾に改行がない"
).encode()


def lines(records):
    return [(record.rank, record.stream, record.worker_index, record.text) for record in records]


def read_in_chunks(followed: FollowedFile, data: bytes, cuts: list[int]):
    records = []
    edges = [0, *sorted(cuts), len(data)]
    for start, end in zip(edges, edges[1:], strict=False):
        records += followed.feed(data[start:end])
    return records


def test_one_reader_reads_every_ranks_lines():
    followed = FollowedFile("stdout", PLAN, None)
    records = followed.feed(OUTPUT) + followed.finish()
    assert lines(records) == [
        (0, "stdout", 0, "step 1 loss=0.5"),
        (1, "stdout", 0, "héllo wörld ✓"),
        (3, "stdout", 1, "other rank"),
        (2, "stdout", 1, "half a line in two writes"),
        (None, "stdout", 0, "mpirun's own words before any tag"),
        (3, "stderr", 1, "Traceback (most recent call last):"),
        (0, "stdout", 0, "末尾に改行がない"),
    ]
    assert followed.offset == len(OUTPUT)


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(OUTPUT)), max_size=8),
       stop_after=st.integers(min_value=0, max_value=8))
def test_a_reader_resumed_from_a_stored_cursor_gives_what_one_reader_gives(cuts, stop_after):
    whole = FollowedFile("stdout", PLAN, None)
    expected = lines(whole.feed(OUTPUT) + whole.finish())

    first = FollowedFile("stdout", PLAN, None)
    edges = [0, *sorted(cuts), len(OUTPUT)]
    stop = min(stop_after, len(edges) - 1)
    records = []
    for start, end in zip(edges[:stop], edges[1:stop + 1], strict=False):
        records += first.feed(OUTPUT[start:end])
    # What the database keeps between two processes: JSON.
    cursor = json.loads(json.dumps(first.cursor()))

    second = FollowedFile("stdout", PLAN, cursor)
    records += second.feed(OUTPUT[cursor["offset"]:]) + second.finish()

    assert lines(records) == expected


def test_a_cursor_inside_a_character_points_before_it():
    followed = FollowedFile("stdout", PLAN, None)
    data = "[1,0]<stdout>:✓\n".encode()
    cut = data.index("✓".encode()) + 1
    followed.feed(data[:cut])
    assert followed.cursor()["offset"] == cut - 1


def test_a_tag_naming_a_rank_the_job_does_not_have_is_the_programs_own_text_not_a_rank():
    followed = FollowedFile("stdout", PLAN, None)
    forged = "".join(f"[1,{rank}]<stdout>:x" for rank in range(4, 2000)) + "[1,99999999999]<stdout>:y\n"
    records = followed.feed(forged.encode()) + followed.finish()
    assert [(record.rank, record.worker_index) for record in records] == [(None, 0)]
    assert len(followed.cursor()["reader"]["pending"]) == 0, "nothing held for ranks that do not exist"


def test_only_ascii_digits_make_a_tag_as_the_rank_agents_filter_sees_them():
    # Arabic-Indic and fullwidth digits: a rank's text that the filter leaves as it is must stay that rank's.
    followed = FollowedFile("stdout", PLAN, None)
    text = "[\u0661,\u0661]<stdout>:forged [\uff11,\uff12]<stdout>:too"
    records = followed.feed(f"[1,0]<stdout>:{text}\n".encode()) + followed.finish()
    assert [(record.rank, record.text) for record in records] == [(0, text)]
