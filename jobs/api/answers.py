"""The answers the views build by hand (results, logs, NCCL), described field by field for the schema.

The views return plain dicts; these serializers are what the OpenAPI schema says they hold, and the schema
tests check the answers against it.
"""

from rest_framework import serializers


def free_form(description: str, **kwargs) -> serializers.JSONField:
    return serializers.JSONField(help_text=description, **kwargs)


class LogLineSerializer(serializers.Serializer):
    seq = serializers.IntegerField(help_text="The line's sequence number in the job's log, gapless from 1.")
    worker = serializers.IntegerField(allow_null=True, help_text="The worker it came from; null for the platform's own.")
    rank = serializers.IntegerField(allow_null=True, help_text="The rank that printed it; null when not a rank's.")
    stream = serializers.CharField(help_text="stdout, stderr, or system (the platform's own lines).")
    text = serializers.CharField(allow_blank=True, help_text="The line, without its line break.")
    at = serializers.DateTimeField(help_text="When it was read.")


class LogLinesSerializer(serializers.Serializer):
    lines = LogLineSerializer(many=True, help_text="The lines, in order.")
    next = serializers.IntegerField(allow_null=True, help_text=(
        "The `after` to follow on with (null when reading back with `before`)."))
    more = serializers.BooleanField(help_text="More lines are there already: ask again at once.")
    previous = serializers.IntegerField(allow_null=True, help_text=(
        "The `before` of the next older page; null at the start of the log."))
    status = serializers.CharField(help_text="The job's state.")
    total = serializers.IntegerField(help_text="Lines stored so far.")
    capped = serializers.BooleanField(help_text="The log reached its cap: later output is not stored.")
    dropped = serializers.IntegerField(help_text="Lines of output not stored because of the cap.")


class FirstErrorSerializer(serializers.Serializer):
    seq = serializers.IntegerField(allow_null=True, help_text="The first error-looking line's sequence number; null if none.")
    line = LogLineSerializer(allow_null=True, help_text="That line; null if none.")


class RankEndSerializer(serializers.Serializer):
    rank = serializers.IntegerField(help_text="The rank.")
    worker = serializers.IntegerField(help_text="The worker it ran in.")
    node = serializers.CharField(allow_blank=True, help_text="The node it ran on.")
    exit_code = serializers.IntegerField(allow_null=True, help_text="Its exit code; null when a signal ended it.")
    signal = serializers.IntegerField(allow_null=True, help_text="The signal that ended it, if one did.")
    signal_name = serializers.CharField(allow_blank=True, help_text="The signal's name, e.g. SIGKILL.")
    stop_signal = serializers.CharField(allow_blank=True, help_text="The signal a stop sent it, if any.")
    ended_at = serializers.DateTimeField(allow_null=True, help_text="When it ended.")
    how = serializers.CharField(help_text="How it ended, in words.")


class HungSerializer(serializers.Serializer):
    since = serializers.DateTimeField(help_text="Since when the job is suspected hung.")
    watchdog_seconds = serializers.IntegerField(allow_null=True, help_text="The silence the watchdog allows.")
    ranks = free_form("The silent ranks: {rank, worker, node, silent_since, last_line, limit_seconds} each (limit_seconds: the silence it was measured against; absent for jobs marked before it was kept).")


class OutcomeSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The job's id.")
    status = serializers.CharField(help_text="The job's state.")
    exit_code = serializers.IntegerField(allow_null=True, help_text="mpirun's exit code.")
    status_message = serializers.CharField(allow_blank=True, help_text="What the last change of state said.")
    stop_reason = serializers.CharField(allow_blank=True, help_text="Who stopped it: the user (empty), auto_stop or watchdog.")
    suspected_hung = HungSerializer(allow_null=True, help_text="Set while the watchdog suspects the job hangs.")
    ranks = RankEndSerializer(many=True, help_text="Each rank's end, as its node recorded it.")
    failure = free_form("The \"why it failed\" card (first failure: worker, node, exception or signal, last lines, "
                        "mpirun's and Open MPI's own words); "
                        "null for a job that did not fail.", allow_null=True)
    cleanup = free_form("What the teardown found on each node: {checked_at, clean, workers: [...]}; null before it.",
                        allow_null=True)


class MetricLastSerializer(serializers.Serializer):
    value = serializers.FloatField(help_text="The value.")
    step = serializers.IntegerField(allow_null=True, help_text="Its step, when the regex has a `step` group.")
    at = serializers.DateTimeField(help_text="When its line was read.")


class MetricSummarySerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The metric's name.")
    regex = serializers.CharField(help_text="The expression it is read with.")
    count = serializers.IntegerField(help_text="Points read so far.")
    last = MetricLastSerializer(allow_null=True, help_text="The last point; null before the first.")
    matched = serializers.BooleanField(help_text="Some line matched.")
    note = serializers.CharField(allow_blank=True, help_text="Why there is no point, when there is none.")
    downsampled = serializers.BooleanField(help_text="Its points here are a downsampled series (max_points).")


class MetricPointSerializer(MetricLastSerializer):
    id = serializers.IntegerField(help_text="The point's id: the `after` to go on from.")
    name = serializers.CharField(help_text="The metric's name.")
    rank = serializers.IntegerField(allow_null=True, help_text="The rank whose line it was read from.")


class MetricsSerializer(serializers.Serializer):
    status = serializers.CharField(help_text="The job's state.")
    final = serializers.BooleanField(help_text="The job is over: no more points will come.")
    metrics = MetricSummarySerializer(many=True, help_text="Each defined metric.")
    points = MetricPointSerializer(many=True, help_text="The points after `after`, at most 5000.")
    next = serializers.IntegerField(help_text="The `after` to ask for next.")
    more = serializers.BooleanField(help_text="More points are there already.")


class OutputFileSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="The file's path in train_url.")
    size = serializers.IntegerField(help_text="Its size, in bytes.")
    kept = serializers.BooleanField(help_text="It fitted in the outputs limit and can be downloaded.")
    url = serializers.CharField(allow_null=True, help_text="Where to download it; null when not kept.")


class OutputsSerializer(serializers.Serializer):
    summary = free_form("What became of train_url: {state, message, kept_files, kept_bytes, total_files, "
                        "total_bytes, limit_bytes}; null before the job ends.", allow_null=True)
    files = OutputFileSerializer(many=True, help_text="The files found in train_url.")
    archive_url = serializers.CharField(allow_null=True, help_text="All kept files as one .tar.gz; null if none.")


class ExpectedRunSerializer(serializers.Serializer):
    network = serializers.CharField(help_text="The network the spec promises.")
    nodes = serializers.IntegerField(help_text="Nodes the job asked for.")
    ranks = serializers.IntegerField(help_text="Ranks it should have.")
    workers = serializers.ListField(child=serializers.CharField(), help_text="Its workers' host names.")


class NcclReportSerializer(serializers.Serializer):
    status = serializers.CharField(help_text="The job's state.")
    final = serializers.BooleanField(help_text="The job is over: the report will not change.")
    seen = serializers.BooleanField(help_text="NCCL printed something, or the program quoted one of its errors.")
    log_lines = serializers.IntegerField(help_text="Lines the job has stored.")
    nccl_lines = serializers.IntegerField(help_text="Of them, the lines read as NCCL's.")
    truncated = serializers.BooleanField(help_text="Too many NCCL lines: the summary is of the first ones.")
    expected = ExpectedRunSerializer(help_text="What the job's spec and size promise.")
    summary = free_form("What NCCL did (nccl.NcclSummary): version, transports, interfaces, ranks on hosts and "
                        "GPUs, init, warnings.")
    diagnosis = free_form("Findings in plain words, errors first: {severity, code, message} each.")
