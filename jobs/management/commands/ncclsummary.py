"""`manage.py ncclsummary FILE [--json]`: what NCCL really did, read from a job log."""

import json

from django.core.management.base import BaseCommand, CommandError

from jobs.nccl_parser import format_summary_text, parse_nccl_file


class Command(BaseCommand):
    help = "Summarise an NCCL_DEBUG=INFO log: version, ranks, network and transports, warnings, errors."

    def add_arguments(self, parser):
        parser.add_argument("file", help="path of the log file to read")
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    def handle(self, *args, **options):
        path = options["file"]
        try:
            # Streams the file; bytes that are not UTF-8 are replaced, never fatal.
            summary = parse_nccl_file(path)
        except FileNotFoundError:
            raise CommandError(f"No such log file: {path}") from None
        except IsADirectoryError:
            raise CommandError(f"{path} is a directory, not a log file") from None
        except PermissionError:
            raise CommandError(f"Cannot read {path}: permission denied") from None
        if options["json"]:
            self.stdout.write(json.dumps(summary.to_dict(), sort_keys=True))
        else:
            self.stdout.write(format_summary_text(summary), ending="")
