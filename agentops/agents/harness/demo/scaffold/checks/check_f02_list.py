from _lib import Todo, expect, passed

t = Todo()
code, out, _ = t.run("list")
expect(code == 0 and out.strip() == "No tasks.", "an empty list prints 'No tasks.'")
t.run("add", "Buy milk")
t.run("add", "Walk the dog")
code, out, _ = t.run("list")
expect(code == 0 and out.splitlines() == ["1 [ ] Buy milk", "2 [ ] Walk the dog"], "list shows tasks in id order")
passed("F02")
