from _lib import Todo, expect, passed

t = Todo()
t.run("add", "Buy milk")
t.run("add", "Walk the dog")
t.run("done", "1")
code, out, _ = t.run("list", "--open")
expect(code == 0 and out.splitlines() == ["2 [ ] Walk the dog"], "--open shows open tasks only")
code, out, _ = t.run("list", "--done")
expect(code == 0 and out.splitlines() == ["1 [x] Buy milk"], "--done shows done tasks only")
passed("F06")
