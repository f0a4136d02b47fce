"""The task API: agent views (``agent``), staff views (``staff``), shared serializers.

``portal/urls.py`` routes to the views; errors are in ``tasks/exceptions.py``.
"""
