"""One way to write a moment on every admin page: 2026-12-01 09:14:02 UTC (ISO order, 24 h, the zone).

Django's English default ("Dec. 1, 2026, 9:14 a.m.") is what the admin's own fields and lists
used beside our tables, so one page showed two formats; these replace it everywhere.
"""
DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = DATETIME_FORMAT
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = DATE_FORMAT
TIME_FORMAT = "H:i:s"
