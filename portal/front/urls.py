from django.contrib.auth import views as auth_views
from django.urls import path

from portal.front import job_control_views, views
from portal.teams import views as teams_views

urlpatterns = [
    path("", views.index, name="index"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/new/", views.job_new, name="job_new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel_view, name="job_cancel"),
    path("jobs/<int:job_id>/preempt/", views.job_preempt_view, name="job_preempt"),
    path("jobs/<int:job_id>/edit/", job_control_views.job_edit, name="job_edit"),
    path(
        "jobs/<int:job_id>/<str:verb>/",
        job_control_views.job_control_view,
        name="job_control",
    ),
    path("jobs/array/<int:array_id>/", job_control_views.job_array, name="job_array"),
    path("profiles/", views.profiles, name="profiles"),
    path("profiles/<int:profile_id>/", views.profile_detail, name="profile_detail"),
    path(
        "profiles/<int:profile_id>/profiling/",
        views.profile_profiling,
        name="profile_profiling",
    ),
    path("cluster/", views.cluster, name="cluster"),
    path("cluster/node-tokens/", views.node_tokens, name="node_tokens"),
    path(
        "cluster/node-tokens/<int:token_id>/revoke/",
        views.node_token_revoke_view,
        name="node_token_revoke",
    ),
    path(
        "cluster/nodes/<int:node_id>/<str:op>/",
        views.node_operate_view,
        name="node_operate",
    ),
    path("usage/", teams_views.usage_page, name="usage"),
    path("account/", views.account, name="account"),
    path("account/tokens/", views.token_new, name="token_new"),
    path("account/tokens/<int:token_id>/revoke/", views.token_revoke_view, name="token_revoke"),
    path("docs/", views.docs, name="docs"),
    path("docs/<path:path>", views.docs, name="docs_page"),
]
