# The allowed-options help names an example that places no ranks.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0012_merge_containment_limits'),
    ]

    operations = [
        migrations.AlterField(
            model_name='launcherdefaults',
            name='extra_options_allowed',
            field=models.TextField(blank=True, help_text="mpirun options users may give in OPENMPI_EXTRA_ARGS beyond the built-in list, one per line: the option alone for a flag, or the option and a regular expression its value must match, e.g. '--display-topo', '--timeout [0-9]+' or, for an MCA parameter, '--mca coll_hcoll_enable [01]' (the expression matches the name and the value)."),
        ),
    ]
