"""MetaSchedule tuning for the ``tvm`` target.

``tune`` (what to tune, applying records), ``store`` (the shared record store), ``search``
(running MetaSchedule on a small host).
"""
