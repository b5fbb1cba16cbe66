from _lib import Todo, expect, passed

t = Todo()
t.run("add", "--due", "2026-12-01", "Overdue")
t.run("add", "--due", "2026-12-05", "Later")
t.run("add", "No date")
t.run("add", "--due", "2026-11-01", "Done already")
t.run("done", "4")
code, out, _ = t.run("list", "--overdue", today="2026-12-02")
expect(code == 0 and out.splitlines() == ["1 [ ] Overdue (due 2026-12-01)"], "--overdue shows the overdue open task")
passed("F08")
