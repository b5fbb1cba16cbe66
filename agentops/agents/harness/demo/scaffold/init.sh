#!/bin/sh
# Prepare a session: todo needs Python 3.10 or later and nothing else.
set -e
python -c 'import sys; assert sys.version_info >= (3, 10), sys.version'
