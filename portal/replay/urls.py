from django.urls import path

from portal.replay import views

urlpatterns = [
    path("", views.replay_list, name="replay_list"),
    path("<int:run_id>/", views.replay_detail, name="replay_detail"),
    path("<int:run_id>/status/", views.replay_status, name="replay_status"),
    path("<int:run_id>/delete/", views.replay_delete, name="replay_delete"),
    path("<int:run_id>/files/<str:name>", views.replay_file, name="replay_file"),
]
