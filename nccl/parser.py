"""Read an NCCL_DEBUG=INFO log and report what NCCL really did on the network.

One pass over the lines; memory grows with the number of ranks, channels,
interfaces and (capped) warnings, never with the length of the log.  Any
string is accepted: lines that look like NCCL but cannot be read are counted
in `unparsed`, and nothing raises.  No Django imports, so workers, scripts
and tests can use it directly.

Two ways in:

* `parse_nccl_log(lines)`, `parse_nccl_text(text)`, `parse_nccl_file(path)`
  read raw text, lines as printed (an mpirun tag such as "[1,3]<stdout>:" in
  front of a line is read and stripped by the parser itself);
* `NcclLogReader` is fed line by line, either raw lines (`feed_line`) or
  structured records a launcher already split (`feed_record(rank, stream,
  text)`), and gives a `summary()` at any time, as often as wanted, while
  feeding goes on.

The collector owns a `NetworkFacts` (nccl.network) and a `ProblemFacts`
(nccl.problems) and routes each message to the one it concerns; neither of
them calls the other or the collector.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable

from . import patterns as P
from .network import NetworkFacts
from .problems import MAX_TRACKED, ProblemFacts
from .summary import NcclSummary, build_summary, format_summary_text

__all__ = [
    "STREAMS",
    "NcclLogReader",
    "NcclSummary",
    "format_summary_text",
    "parse_nccl_file",
    "parse_nccl_log",
    "parse_nccl_text",
    "read_bounded_lines",
]

# The streams of a structured record: a rank's stdout or stderr, or the launcher's own lines.
STREAMS = ("stdout", "stderr", "system")
_RANK_STREAMS = frozenset(STREAMS[:2])

MAX_RANK_RECORDS = 1 << 16
MAX_LINE_CHARS = 1 << 16
MAX_UNPARSED_EXAMPLES = 5
_HOST_JUNK = "\"'`>([{"
_find_header = P.HEADER.search
_GLUED_SECONDS = re.compile(r"\d\d(?:[.,]\d+)?Z?")


class _Collector:
    """Accumulates facts line by line; `summary()` turns them into a NcclSummary.

    Facts about the network go to `self.network`, warnings and errors to
    `self.problems`; the rest (versions, ranks, communicators, rings and
    trees, the line counts) is kept here.
    """

    def __init__(self) -> None:
        self.network = NetworkFacts()
        self.problems = ProblemFacts(note_text=self.network.note_socket_interface_failure)
        self.line_count = 0
        self.nccl_line_count = 0
        self.versions: dict[str, str | None] = {}
        self.cuda_version: str | None = None
        self.nranks_seen: set[int] = set()
        self.nnodes: int | None = None
        self.hosts: dict[str, None] = {}
        self.processes: set[tuple[str, int]] = set()
        self.rank_records: dict[tuple[int | None, int], dict] = {}
        self.comms: dict[tuple, dict] = {}
        self.comm_index: dict[tuple, tuple] = {}
        self.comm_ids: set[str] = set()
        self.ring_orders: dict[tuple[int, ...], set[int]] = {}
        self.ring_channel_count: int | None = None
        self.ring_graph_lines = 0
        self.tree_lines = 0
        self.tree_channels = 0
        self.tree_graph_lines = 0
        self.connected_all_rings = False
        self.net_peers: set[tuple[str, int]] = set()
        self.unparsed_count = 0
        self.parser_errors = 0  # lines the parser itself failed on: a bug to fix, counted in unparsed
        self.unparsed_examples: list[str] = []
        self.dispatch = {
            "Channel": self.on_channel,
            "Ring": self.on_channel,
            "Trees": self.on_trees,
            "Tree": self.on_graph_tree,
            "comm": self.on_comm,
            "ncclCommInitRank": self.on_comm,
            "ncclCommInitAll": self.on_comm,
            "ncclCommInitRankConfig": self.on_comm,
            "ncclCommSplit": self.on_comm,
            "ncclCommInitRankScalable": self.on_comm,
            "bootstrapSplit": self.on_comm,
            "rank": self.on_bare_rank,
            "nranks": self.on_bare_nranks,
            "Init": self.on_init_timings,
            "NCCL": self.on_version_word,
            "Connected": self.on_connected,
            **self.network.network_dispatch(),
        }

    # -- entry points ------------------------------------------------------
    def feed(self, raw: object, launcher_rank: int | None = None) -> None:
        """One line of any type; a line the parser fails on is counted, never raised."""
        self.line_count += 1
        try:
            if type(raw) is not str or len(raw) > MAX_LINE_CHARS:
                raw = _as_text(raw)[:MAX_LINE_CHARS]
            self.read_line(raw.rstrip("\r\n"), launcher_rank)
        except Exception:  # noqa: BLE001 - one odd line must not lose the rest of the log
            self.parser_errors += 1
            self.add_unparsed(raw.rstrip("\r\n") if type(raw) is str else "<a line that could not be read>")

    def feed_all(self, lines: Iterable[object]) -> None:
        """`feed` over an iterable, inlined: this loop is the parser's hot path."""
        read_line = self.read_line
        try:
            for raw in lines:
                self.line_count += 1
                try:
                    if type(raw) is not str or len(raw) > MAX_LINE_CHARS:
                        raw = _as_text(raw)[:MAX_LINE_CHARS]
                    read_line(raw.rstrip("\r\n"))
                except Exception:  # noqa: BLE001 - one odd line must not lose the rest of the log
                    self.parser_errors += 1
                    self.add_unparsed(raw.rstrip("\r\n") if type(raw) is str else "<a line that could not be read>")
        except Exception:  # noqa: BLE001 - a failing iterator ends the input, it does not crash the caller
            self.add_unparsed("<the input ended with a read error>")

    def read_line(self, line: str, launcher_rank: int | None = None) -> None:  # noqa: C901 - one line tried against each kind of NCCL line, in the order that matters
        """`launcher_rank`: the rank a launcher stored the line under, its mpirun tag already removed."""
        problems = self.problems
        if problems.error_context_lines and problems.follow_error_context(line):
            return
        if "NCCL" not in line:
            if "nccl" in line:
                if P.ERROR_TEXT.search(line):
                    problems.on_error_text(line)
            elif "Pid" in line and "Rank" in line:
                self.on_nccl_tests_rank(line)
            return
        header = _find_header(line)
        if header is None:
            self.read_headerless_nccl_line(line)
            return
        self.nccl_line_count += 1
        pid, tid, dev, source, level = header.groups()
        start = header.start()
        # The host name runs back to the previous space or colon; a prefix
        # such as "[1,0]<stdout>:" or "(WorkerDict pid=1)" ends there.
        cut = max(line.rfind(" ", 0, start), line.rfind(":", 0, start))
        host = line[cut + 1 : start]
        if not host or host[0] in _HOST_JUNK or "\t" in host or host[0].isdecimal():
            host = _clean_host(line, cut, host)
        slot = (host, int(pid), int(dev))
        if slot[:2] not in self.processes:
            self.note_process(host, slot[1])
        text = line[header.end() :].strip()
        if level == "WARN" or level == "ABORT":
            problems.on_warn(slot, tid, source, text, line[:start], launcher_rank)
            return
        if not text or (level != "INFO" and level != "TRACE"):
            self.add_unparsed(line)
            return
        space = text.find(" ")
        word = (text if space < 0 else text[:space]).rstrip(":")
        handler = self.dispatch.get(word)
        if not (handler(slot, tid, text) if handler else self.on_other_info(slot, tid, text, word)):
            self.add_unparsed(line)

    def read_headerless_nccl_line(self, line: str) -> None:
        """Bare "NCCL version" lines, exception text, or a cut NCCL line."""
        has_version = "NCCL version" in line and self.on_version(line)
        if P.ERROR_TEXT.search(line):
            self.problems.on_error_text(line)
        elif has_version:
            self.nccl_line_count += 1
        elif "NCCL INFO" in line or "NCCL WARN" in line or P.HEADER_ONLY.search(line):
            self.add_unparsed(line)

    # -- bookkeeping ---------------------------------------------------------
    def add_unparsed(self, line: str) -> None:
        self.unparsed_count += 1
        if len(self.unparsed_examples) < MAX_UNPARSED_EXAMPLES:
            self.unparsed_examples.append(line[:300])

    def note_process(self, host: str, pid: int) -> None:
        if len(self.processes) < MAX_TRACKED:
            self.processes.add((host, pid))
            self.hosts.setdefault(host, None)

    def note_nranks(self, nranks: int) -> None:
        if len(self.nranks_seen) < 64:
            self.nranks_seen.add(nranks)

    def note_rank(
        self,
        rank: int,
        nranks: int | None,
        slot: tuple | None = None,
        *,
        bus_id: str | None = None,
        cuda_dev: int | None = None,
        nvml_dev: int | None = None,
    ) -> None:
        record = self.rank_records.get((nranks, rank))
        if record is None:
            if len(self.rank_records) >= MAX_RANK_RECORDS:
                return
            record = {
                "rank": rank,
                "host": None,
                "pid": None,
                "cuda_dev": None,
                "nvml_dev": None,
                "bus_id": None,
                "bootstrap_address": None,
            }
            self.rank_records[(nranks, rank)] = record
        if slot is not None and record["host"] is None:
            record["host"], record["pid"] = slot[0], slot[1]
            record["cuda_dev"] = slot[2] if cuda_dev is None else cuda_dev
        for key, value in (("bus_id", bus_id), ("nvml_dev", nvml_dev)):
            if value is not None and record[key] is None:
                record[key] = value

    # -- version and nccl-tests headers ---------------------------------------
    def on_version(self, line: str) -> bool:
        match = P.VERSION.search(line)
        if match is None:
            return False
        version = ".".join(match.group(1, 2, 3))
        suffix = (match.group(4) or "").rstrip(",.;)'\"") or None
        if version not in self.versions and len(self.versions) < 16:
            self.versions[version] = suffix
        if suffix and self.cuda_version is None:
            cuda = P.CUDA_SUFFIX.match(suffix)
            self.cuda_version = cuda.group(1) if cuda else None
        return True

    def on_version_word(self, slot, tid, text) -> bool:
        return text.startswith("NCCL version") and self.on_version(text)

    def on_nccl_tests_rank(self, line: str) -> None:
        match = P.NCCL_TESTS_RANK.search(line)
        if match:
            rank, pid, host, device, bus = match.groups()
            self.note_process(host, int(pid))
            self.note_rank(int(rank), None, (host, int(pid), int(device)), bus_id=P.normalise_bus_id(bus))

    # -- INFO messages -------------------------------------------------------
    def on_other_info(self, slot: tuple, tid: str, text: str, word: str) -> bool:
        if word.startswith("NET/IB"):
            return self.network.on_net_ib(slot, tid, text)
        if word.startswith("NCCL_"):
            return self.network.on_env(text)
        if word.isdecimal():
            return self.network.on_numbered(text)
        if word.startswith(P.TOPOLOGY_WORD_PREFIXES):
            return self.network.on_topology(text)
        backtrace = P.BACKTRACE.match(text)
        if backtrace:
            self.problems.on_backtrace(slot, tid, backtrace.group(1), int(backtrace.group(2)))
            return True
        return word in P.QUIET_FIRST_WORDS or P.SOURCE_LOCATION.match(text) is not None

    def on_channel(self, slot: tuple, tid: str, text: str) -> bool:
        if " via " in text:
            match = P.CONNECTION.match(text)
            if match is None:
                return False
            self.on_connection(slot, match)
            return True
        if "->" in text:
            match = P.GRAPH_RING.match(text)
            if match is None:
                return False
            self.ring_graph_lines += 1
            self.note_rank(int(match.group(3)), None, slot)
            return True
        match = P.RING_ORDER.match(text)
        if match is None:
            return False
        order = tuple(int(n) for n in match.group(3).split())
        if match.group(2) is not None:
            self.ring_channel_count = max(self.ring_channel_count or 0, int(match.group(2)))
        if len(set(order)) == len(order):
            self.note_nranks(len(order))
        channels = self.ring_orders.get(order)
        if channels is None and len(self.ring_orders) < 64 and len(order) <= 8192:
            channels = self.ring_orders[order] = set()
        if channels is not None and len(channels) < 256:
            channels.add(int(match.group(1)))
        return True

    def on_connection(self, slot: tuple, match) -> None:
        _, _, src, src_tag, dst, dst_tag, direction, raw = match.groups()
        transport = self.network.record_transport(raw[:200])
        # The printing rank is the receiver for "[receive]" lines and for 2.3's
        # undirected NET lines, the sender otherwise.
        receiving = direction == "receive" or (direction is None and transport.startswith("NET/"))
        me, me_tag, peer, peer_tag = (dst, dst_tag, src, src_tag) if receiving else (src, src_tag, dst, dst_tag)
        if transport.startswith("NET/") and len(self.net_peers) < MAX_TRACKED:
            self.net_peers.add((slot[0], int(peer)))
        bus_format = me_tag is not None and P.looks_like_bus_id(me_tag)
        self.note_rank(int(me), None, slot, bus_id=P.normalise_bus_id(me_tag) if bus_format else None)
        if bus_format and peer_tag is not None:
            self.note_rank(int(peer), None, bus_id=P.normalise_bus_id(peer_tag))

    def on_trees(self, slot: tuple, tid: str, text: str) -> bool:
        items = P.TREES_ITEM.findall(text)
        if not items:
            return False
        self.tree_lines += 1
        self.tree_channels = max(self.tree_channels, max(int(item[0]) for item in items) + 1)
        self.note_rank(int(items[0][2]), None, slot)
        return True

    def on_graph_tree(self, slot: tuple, tid: str, text: str) -> bool:
        match = P.GRAPH_TREE.match(text)
        if match is None:
            return False
        self.tree_graph_lines += 1
        self.note_rank(int(match.group(3)), None, slot)
        return True

    def on_connected(self, slot: tuple, tid: str, text: str) -> bool:
        if text.startswith("Connected all rings"):
            self.connected_all_rings = True
        elif "NVLS" in text:
            self.network.nvls_used = True
        return True

    # -- communicators ---------------------------------------------------------
    def on_comm(self, slot: tuple, tid: str, text: str) -> bool:
        match = P.COMM.search(text)
        if match is None:
            return False
        pointer, rank, nranks, rest = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
        fields = dict(P.COMM_FIELD.findall(rest))
        event_match = P.COMM_EVENT.search(rest)
        event = event_match.group(1) if event_match else None
        self.note_nranks(nranks)
        if fields.get("nNodes", "").isdecimal():
            self.nnodes = max(self.nnodes or 0, int(fields["nNodes"]))
        if "commId" in fields and len(self.comm_ids) < 1000:
            self.comm_ids.add(fields["commId"])
        cuda_dev = fields.get("cudaDev", "")
        nvml_dev = fields.get("nvmlDev", "")
        self.note_rank(
            rank,
            nranks,
            slot,
            bus_id=P.normalise_bus_id(fields["busId"]) if "busId" in fields else None,
            cuda_dev=int(cuda_dev) if cuda_dev.isdecimal() else None,
            nvml_dev=int(nvml_dev) if nvml_dev.isdecimal() else None,
        )
        key = (slot[0], slot[1], pointer)
        index_key = (slot, rank, nranks)
        previous = self.comm_index.get(index_key)
        state = self.comms.get(key)
        if state is None:
            # 2.3 printed "rank R nranks N" before "comm 0x.. rank R nranks N": one handle.
            state = self.comms.pop(previous, None) if previous and previous[2] is None else None
            if state is None and len(self.comms) >= MAX_TRACKED:
                return True
            state = self.comms[key] = state or {"started": False, "complete": False, "aborted": False}
        self.comm_index[index_key] = key
        if event == "Abort COMPLETE":
            state["aborted"] = True
            self.problems.add_error(("abort",), "NCCL communicator aborted (Abort COMPLETE)", slot[:2])
        elif event in ("Init COMPLETE", "COMPLETE"):
            state["started"] = state["complete"] = True
        elif event != "Destroy COMPLETE":
            state["started"] = True
        return True

    def on_bare_rank(self, slot: tuple, tid: str, text: str) -> bool:
        match = P.RANK_NRANKS.match(text)
        if match is None:
            return False
        rank, nranks = int(match.group(1)), int(match.group(2))
        self.note_nranks(nranks)
        self.note_rank(rank, nranks, slot)
        index_key = (slot, rank, nranks)
        if index_key not in self.comm_index and len(self.comms) < MAX_TRACKED:
            key = (slot[0], slot[1], None, slot[2], rank)
            self.comms[key] = {"started": True, "complete": False, "aborted": False}
            self.comm_index[index_key] = key
        return True

    def on_bare_nranks(self, slot: tuple, tid: str, text: str) -> bool:
        match = P.BARE_NRANKS.match(text)
        if match:
            self.note_nranks(int(match.group(1)))
        return match is not None

    def on_init_timings(self, slot: tuple, tid: str, text: str) -> bool:
        match = P.RANK_NRANKS.search(text)
        if match is None:
            return False
        self.note_nranks(int(match.group(2)))
        self.note_rank(int(match.group(1)), int(match.group(2)), slot)
        return True

    # -- results ---------------------------------------------------------------
    def summary(self) -> NcclSummary:
        """Reads the state, changes nothing: feeding may go on after it."""
        return build_summary(self, self.network, self.problems)


class NcclLogReader:
    """An NCCL log read as it grows: feed lines, take `summary()` whenever wanted.

    `feed_line(text)` takes a raw line as printed (an mpirun tag in front is
    read by the parser); `feed_record(rank, stream, text)` takes a line a
    launcher already split: `rank` the launcher rank whose output it is (None
    for a line that is not a rank's), `stream` one of "stdout", "stderr" or
    "system" (the launcher's own lines; the rank of a record on any stream
    but "stdout" and "stderr" is not used), `text` the line without its tag.
    A record of rank R reads like the raw line "[1,R]<stream>:text", except
    that texts kept from it (error lines, unparsed examples) do not carry the
    tag.  `summary()` can be called any number of times while feeding goes
    on; each summary is independent of the reader's later state.  Not
    thread-safe: callers that share a reader lock it.
    """

    __slots__ = ("_collector",)

    def __init__(self) -> None:
        self._collector = _Collector()

    @property
    def line_count(self) -> int:
        """Lines and records fed so far."""
        return self._collector.line_count

    def feed_line(self, line: str) -> None:
        """One raw line; its end of line, if any, is dropped."""
        self._collector.feed(line)

    def feed_lines(self, lines: Iterable[str]) -> None:
        """Raw lines from any iterable (a file object works); an iterator that fails ends the input."""
        if isinstance(lines, (str, bytes)):
            lines = io.StringIO(_as_text(lines), newline=None)  # a whole text: iterating it would give characters
        self._collector.feed_all(lines)

    def feed_record(self, rank: int | None, stream: str, text: str) -> None:
        """One line as a launcher stored it: whose it is, on which stream, and its text without the tag."""
        self._collector.feed(text, rank if stream in _RANK_STREAMS else None)

    def feed_records(self, records: Iterable[tuple[int | None, str, str]]) -> None:
        """`feed_record` for each (rank, stream, text) tuple."""
        for rank, stream, text in records:
            self.feed_record(rank, stream, text)

    def summary(self) -> NcclSummary:
        return self._collector.summary()


def _clean_host(line: str, cut: int, host: str) -> str:
    """Host names behind quotes, tabs, or a timestamp glued on ("12:34:56.789Zip-10-0-0-1")."""
    host = host.rpartition("\t")[2].lstrip(_HOST_JUNK)
    if cut >= 3 and line[cut] == ":" and line[cut - 3] == ":" and line[cut - 2 : cut].isdecimal():
        glued = _GLUED_SECONDS.match(host)
        if glued and glued.end() < len(host):
            host = host[glued.end() :]
    return host or "?"


def _as_text(raw: object) -> str:
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).decode("utf-8", errors="replace")
    return str(raw)


def parse_nccl_log(lines: Iterable[str]) -> NcclSummary:
    """Parse an iterable of log lines (a file object works) in one pass."""
    if isinstance(lines, (str, bytes)):
        return parse_nccl_text(lines)  # a whole log passed by mistake: iterating it would give characters
    collector = _Collector()
    collector.feed_all(lines)
    return collector.summary()


def parse_nccl_text(text: str) -> NcclSummary:
    """Parse a whole log held in memory; \\r, \\r\\n and \\n all end a line."""
    if not isinstance(text, str):
        text = _as_text(text)
    return parse_nccl_log(io.StringIO(text, newline=None))


def parse_nccl_file(path) -> NcclSummary:
    """Parse a log file, replacing bytes that are not UTF-8."""
    with open(path, encoding="utf-8", errors="replace", newline=None) as handle:
        return parse_nccl_log(read_bounded_lines(handle))


def read_bounded_lines(handle, limit: int = MAX_LINE_CHARS):
    """Lines of a text file cut to `limit` characters: one endless line (a
    progress bar that never prints a newline) must not fill the memory."""
    readline = handle.readline
    while True:
        line = readline(limit)
        if not line:
            return
        if len(line) == limit and line[-1] != "\n":
            rest = readline(limit)
            while rest and rest[-1] != "\n":
                rest = readline(limit)
        yield line
