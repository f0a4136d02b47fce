"""The task API: agent views (``agent``), staff views (``staff``), shared serializers.

``config/urls.py`` routes to the views; errors are in ``tasks/exceptions.py``.
"""
