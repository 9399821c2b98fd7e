"""The "why it failed" card in the page's language.

A card is made once, in English, when the run ends (jobs.results.failure_card) and kept with the job; its
sentences have a few fixed shapes. Here each shape is written once as a message of the catalogue, read back
into its parts (a rank, a node, an exception), and said again in the reader's language. Names, exceptions
and mpirun's or NCCL's own lines stay as they were written; a sentence of no known shape is shown as it is.
"""

import re
from functools import cache

from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

# Most specific first: the first shape that matches the whole sentence wins.
SHAPES = (
    # Who failed, and how a rank ended (jobs.results.rank_records.describe_end, describe_outcome).
    gettext_noop("%(how)s, after SIG%(signal)s was sent to it"),
    gettext_noop("Rank %(rank)s (worker-%(worker)s, %(node)s)"),
    gettext_noop("Rank %(rank)s (worker-%(worker)s)"),
    gettext_noop("killed by signal 9 (SIGKILL): most often the out-of-memory killer"),
    gettext_noop("segmentation fault (signal 11, SIGSEGV)"),
    gettext_noop("ended by signal %(signal)s (%(name)s: %(text)s)"),
    gettext_noop("no exit status recorded"),
    gettext_noop("exit code %(code)s: killed, most often for running out of memory"),
    gettext_noop("exit code 139: a segmentation fault, often a library conflict"),
    gettext_noop("exit code 139: a segmentation fault"),
    gettext_noop("exit code 127: the program or its interpreter was not found"),
    gettext_noop("exit code 126: the program could not be executed"),
    gettext_noop("exit code %(code)s"),
    # The card's headline.
    gettext_noop("worker-%(worker)s on %(node)s was stopped at its disk limit"),
    gettext_noop("worker-%(worker)s was stopped at its disk limit"),
    gettext_noop("A node was lost mid-job: %(node)s"),
    gettext_noop("A node was lost mid-job"),
    gettext_noop("mpirun failed after Open MPI warned about OPENMPI_EXTRA_ARGS"),
    gettext_noop("%(who)s failed after Open MPI warned about OPENMPI_EXTRA_ARGS"),
    gettext_noop("mpirun could not start or reach its daemon on %(node)s"),
    gettext_noop("mpirun could not start or reach its daemon"),
    gettext_noop("mpirun found not enough slots for the processes asked for"),
    gettext_noop("The program could not be started on %(who)s"),
    gettext_noop("The program could not be started"),
    gettext_noop("The job failed before its processes started"),
    gettext_noop("NCCL failed in %(who)s: %(line)s"),
    gettext_noop("NCCL failed: %(line)s"),
    gettext_noop("%(who)s was killed, most likely for running out of memory"),
    gettext_noop("%(who)s crashed with a segmentation fault"),
    gettext_noop("%(who)s raised %(exception)s"),
    gettext_noop("%(who)s was %(how)s"),
    gettext_noop("%(who)s exited with %(how)s"),
    gettext_noop("The run ended abnormally"),
    gettext_noop("mpirun ended with exit code %(code)s"),
    gettext_noop("Stopped by the watchdog: rank(s) %(ranks)s printed nothing for more than %(seconds)s s"),
    gettext_noop("Stopped by the watchdog: rank(s) %(ranks)s printed nothing"),
    gettext_noop("Stopped by auto stop: the job reached its limit of %(hours)s h"),
    # What the other ranks did.
    gettext_noop("finished (exit code 0)"),
    gettext_noop("left no record: ended with its container"),
    gettext_noop("left no exit status: ended with its container"),
    gettext_noop("was silent (suspected hung), then ended with its container"),
    gettext_noop("was silent (suspected hung), then %(what)s"),
    gettext_noop("ended by the stop (SIG%(signal)s)"),
    gettext_noop("ended by mpirun (SIG%(signal)s) after rank %(rank)s failed"),
    gettext_noop("ended by mpirun (SIG%(signal)s)"),
    gettext_noop("failed too: %(how)s"),
    # The hints.
    gettext_noop("The job ran past its auto stop limit; set a longer limit, or none, when creating it."),
    gettext_noop("A rank that prints nothing for the watchdog time is taken as hung (a deadlock, a collective some ranks never "
                 "reach, a stuck read). Print progress more often, or set a longer watchdog time."),
    gettext_noop("The node stopped answering (rebooted, lost its network, or ran out of memory). It is kept out of service "
                 "until it is checked."),
    gettext_noop("mpirun reaches the other workers over SSH on the job's port: check that every worker's container started "
                 "and that the nodes can reach each other."),
    gettext_noop("OPENMPI_EXTRA_ARGS may ask for more processes per node than the hostfile gives."),
    gettext_noop("The engine's interpreter must exist and be readable by the job's user on every node."),
    gettext_noop("The NCCL panel shows what NCCL found (interfaces, transports, the first warning)."),
    gettext_noop("Exit code 137 (or SIGKILL) usually means the out-of-memory killer: use less memory per process or fewer "
                 "processes per node."),
    gettext_noop("Exit code 139 often comes from a library conflict (CUDA, NCCL or MPI libraries of different versions)."),
    gettext_noop("mpirun saw a rank exit without calling MPI finalize: every rank must reach the end together."),
    gettext_noop("Open MPI's words above are about %(setting)s, given in OPENMPI_EXTRA_ARGS: the likely cause. Correct it "
                 "or leave it out, then rebuild the job."),
    gettext_noop("Open MPI warned before the failure (its words are quoted above): they may explain it."),
    gettext_noop("worker-%(worker)s: it passed its disk limit of %(limit)s: its home and its container's own files hold "
                 "%(used)s"),
    gettext_noop("worker-%(worker)s: it passed its disk limit: its node's disk has %(free)s free, under the "
                 "%(reserve)s the node keeps for itself"),
    gettext_noop("The spec's disk limit counts what the job writes to its home and inside its container (/tmp included); "
                 "write large outputs to shared storage, or ask for a spec with a larger disk."),
)
# The parts that are themselves sentences of the card; the others (names, exceptions, lines) stay as written.
SAID_AGAIN = {"who", "how", "what"}
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# Parts that are numbers match only numbers, so a longer shape is not read as a shorter one.
NUMBERS = {"rank", "code", "seconds", "hours"}


@cache
def _pattern(shape: str) -> re.Pattern:
    parts, position = [], 0
    for match in PLACEHOLDER.finditer(shape):
        parts.append(re.escape(shape[position:match.start()]))
        name = match.group(1)
        parts.append(f"(?P<{name}>-?\\d+)" if name in NUMBERS else f"(?P<{name}>.+?)")
        position = match.end()
    parts.append(re.escape(shape[position:]))
    return re.compile("".join(parts), re.DOTALL)


def card_words(text: str) -> str:
    """One sentence of a card in the active language; as it is when it has no known shape."""
    if not text:
        return text
    for shape in SHAPES:
        match = _pattern(shape).fullmatch(text)
        if match:
            parts = {name: card_words(value) if name in SAID_AGAIN else value for name, value in match.groupdict().items()}
            return _(shape) % parts if parts else _(shape)
    return text
