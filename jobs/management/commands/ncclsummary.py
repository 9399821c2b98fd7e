"""`manage.py ncclsummary FILE [--json]`: what NCCL really did, read from a job log.

A thin wrapper over the nccl package (`python -m nccl FILE [--json]` prints the same).
"""

from django.core.management.base import BaseCommand, CommandError

from nccl.cli import LogFileError, render, summarise_file


class Command(BaseCommand):
    help = "Summarise an NCCL_DEBUG=INFO log: version, ranks, network and transports, warnings, errors."

    def add_arguments(self, parser):
        parser.add_argument("file", help="path of the log file to read")
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    def handle(self, *args, **options):
        try:
            summary = summarise_file(options["file"])
        except LogFileError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(render(summary, as_json=options["json"]), ending="")
