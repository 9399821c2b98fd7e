"""Seal every stored secret again with the current SECRET_KEY, so that a rotated-out key can be retired.

After a rotation the old key stays in SECRET_KEY_FALLBACKS: secrets sealed with it still open. Once this
command has run, none needs it, and it can be removed from SECRET_KEY_FALLBACKS. A secret that no key opens
is reported and left as it is (the command then exits non-zero)."""

from django.core.management.base import BaseCommand, CommandError
from django.db import models, transaction

from jobs.models import Node, ResourcePool, Storage, TrainingJob, UserStoreKeys, Webhook
from jobs.secret_box import reseal

# Every model field that holds a sealed secret.
SEALED_FIELDS: list[tuple[type[models.Model], str]] = [
    (Node, "sealed_private_key"),
    (TrainingJob, "sealed_ssh_key"),
    (Webhook, "sealed_secret"),
    (ResourcePool, "sealed_slurm_token"),
    (ResourcePool, "sealed_slurm_jwt_key"),
    (Storage, "sealed_access_key"),
    (Storage, "sealed_secret_key"),
    (UserStoreKeys, "sealed_access_key"),
    (UserStoreKeys, "sealed_secret_key"),
]


class Command(BaseCommand):
    help = "Seal every stored secret again with the current SECRET_KEY (then former keys can be retired)."

    def handle(self, *args, **options):
        resealed, unreadable = 0, []
        for model, field in SEALED_FIELDS:
            for pk in model._default_manager.exclude(**{field: ""}).values_list("pk", flat=True).iterator():
                with transaction.atomic():
                    row = model._default_manager.select_for_update().filter(pk=pk).values_list(field, flat=True).first()
                    if not row:
                        continue
                    try:
                        fresh = reseal(row)
                    except ValueError:
                        unreadable.append(f"{model.__name__} {pk} ({field})")
                        continue
                    model._default_manager.filter(pk=pk).update(**{field: fresh})
                    resealed += 1
        self.stdout.write(f"{resealed} secret(s) sealed with the current SECRET_KEY")
        if unreadable:
            raise CommandError("no key opens: " + ", ".join(unreadable))
