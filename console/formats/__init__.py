"""The admin's date formats (settings.FORMAT_MODULE_PATH): times to the second,
with the zone, in every list and read-only field, instead of English's
"Dec. 1, 2026, 4:24 p.m."."""
