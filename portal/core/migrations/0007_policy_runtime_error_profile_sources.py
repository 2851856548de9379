# Issue 18: the scheduling loop's run-time policy errors, and where profile numbers come from.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0006_training_data_ratio"),
    ]

    operations = [
        migrations.AddField(
            model_name="applicationprofile",
            name="sources",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="policysettings",
            name="last_good_params",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="policysettings",
            name="last_good_policy",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.AddField(
            model_name="policysettings",
            name="runtime_error",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="policysettings",
            name="runtime_error_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="policysettings",
            name="runtime_fallback",
            field=models.CharField(
                blank=True, default="", help_text="what the loop ran instead", max_length=200
            ),
        ),
    ]
