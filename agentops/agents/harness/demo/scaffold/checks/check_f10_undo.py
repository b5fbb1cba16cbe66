from _lib import Todo, expect, passed

t = Todo()
code, out, _ = t.run("undo")
expect(code == 0 and out.strip() == "Nothing to undo", "undo with no history says so")
t.run("add", "Keep me")
t.run("add", "Remove me")
t.run("rm", "2")
code, out, _ = t.run("undo")
expect(code == 0, "undo succeeds")
code, out, _ = t.run("list")
expect(out.splitlines() == ["1 [ ] Keep me", "2 [ ] Remove me"], "undo of rm restores the task")
passed("F10")
