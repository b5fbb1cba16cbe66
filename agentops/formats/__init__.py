"""Django format modules (``FORMAT_MODULE_PATH``): how the admin writes dates and times."""
