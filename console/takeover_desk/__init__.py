"""The takeover desk's pages, in three parts above the takeover services.

- :mod:`.evidence`: what a person reads before deciding (the evidence panel, the
  task's latest events as its story shows them, the SLA clocks).
- :mod:`.actions`: the buttons. Each wrapper checks the role on the task's tenant
  (portal/roles.py), then calls the services in ``tasks.takeover`` or
  ``routing.services`` unchanged, with the person as the actor.
- :mod:`.forms`: the resolve and edit forms (which resolutions a task offers, the
  edit form's kept and asked rows) and the sentences that report their outcome.
- :mod:`.names`: display names of owners and how long something waited.

The admin pages (``console/admin/desk.py``) call these and hold no rules of their own.
"""
