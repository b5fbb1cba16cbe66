from _lib import Todo, expect, passed

t = Todo()
t.run("add", "--pri", "low", "Low one")
t.run("add", "Normal one")
t.run("add", "--pri", "high", "Pay rent")
code, out, _ = t.run("list")
expect(out.splitlines() == ["3 [ ] ! Pay rent", "2 [ ] Normal one", "1 [ ] Low one"],
       "list sorts by priority then id, '!' marks high")
code, _, _ = t.run("add", "--pri", "urgent", "Nope")
expect(code == 2, "a bad priority exits 2")
passed("F07")
