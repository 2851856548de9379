"""Every job belongs to a project (docs/projects.md): the field, and existing jobs moved to their
owner's personal project (created here for every owner, the owner its manager)."""

import django.db.models.deletion
from django.db import migrations, models


def _personal_name(Project, username):
    base = "".join(c if c.isalnum() or c in "_.@+-" else "-" for c in username)[:90] or "user"
    if not base[0].isalnum():
        base = "u" + base
    name, n = base, 1
    while Project.objects.filter(name=name).exists():
        n += 1
        name = f"{base}-personal" if n == 2 else f"{base}-personal{n - 1}"
    return name


def jobs_to_personal_projects(apps, schema_editor):
    Job = apps.get_model("core", "Job")
    Project = apps.get_model("teams", "Project")
    Membership = apps.get_model("teams", "Membership")
    User = apps.get_model(*_user_model().split("."))
    owner_ids = Job.objects.filter(project__isnull=True).values_list("owner_id", flat=True)
    for user in User.objects.filter(pk__in=set(owner_ids)):
        project = Project.objects.filter(personal_of=user).first()
        if project is None:
            project = Project.objects.create(
                name=_personal_name(Project, user.username),
                personal_of=user,
                description=f"personal project of {user.username}",
            )
            Membership.objects.create(project=project, user=user, role="manager")
        Job.objects.filter(owner=user, project__isnull=True).update(project=project)


def _user_model():
    from django.conf import settings

    return settings.AUTH_USER_MODEL


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0007_policy_runtime_error_profile_sources"),
        ("teams", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="project",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.RESTRICT,
                related_name="jobs",
                to="teams.project",
            ),
        ),
        migrations.RunPython(jobs_to_personal_projects, migrations.RunPython.noop),
    ]
