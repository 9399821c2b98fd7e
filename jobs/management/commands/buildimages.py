"""`manage.py buildimages [NAME ...]`: build the shipped engine images that are missing (cached by recipe hash)."""

from django.core.management.base import BaseCommand, CommandError

from jobs.images import registry
from jobs.images.build import ImageBuildError, build
from jobs.images.recipes import SHIPPED


class Command(BaseCommand):
    help = "Build the console's engine images (debootstrap + podman), skipping those already built."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", help=f"which images (default: all of {', '.join(SHIPPED)})")

    def handle(self, *args, **options):
        names = options["names"] or list(SHIPPED)
        unknown = [name for name in names if name not in SHIPPED]
        if unknown:
            raise CommandError(f"no such image recipe: {', '.join(unknown)} (known: {', '.join(SHIPPED)})")
        for name in names:
            try:
                build(SHIPPED[name], say=lambda text: self.stdout.write(text))
            except ImageBuildError as error:
                raise CommandError(str(error)) from None
        # What an earlier recipe of an engine left in the registry: whichever images were asked for, every
        # shipped recipe's current one is kept.
        registry.collect_garbage([recipe.reference for recipe in SHIPPED.values()], lambda text: self.stdout.write(text))
