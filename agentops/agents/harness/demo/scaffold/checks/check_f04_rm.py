from _lib import Todo, expect, passed

t = Todo()
for title in ("One", "Two", "Three"):
    t.run("add", title)
code, out, _ = t.run("rm", "2")
expect(code == 0 and out.strip() == "Removed 2", "rm prints 'Removed 2'")
code, out, _ = t.run("list")
expect(out.splitlines() == ["1 [ ] One", "3 [ ] Three"], "the task is gone")
code, out, _ = t.run("add", "Four")
expect(out.strip() == "Added 4: Four", "ids are never reused")
code, _, err = t.run("rm", "9")
expect(code == 2 and err.strip() == "No task 9", "an unknown id exits 2")
passed("F04")
