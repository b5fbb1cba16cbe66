from _lib import Todo, expect, passed

t = Todo()
t.run("add", "Buy milk")
t.run("add", "Walk the dog")
code, out, _ = t.run("done", "1")
expect(code == 0 and out.strip() == "Completed 1", "done prints 'Completed 1'")
code, out, _ = t.run("list")
expect(out.splitlines() == ["1 [x] Buy milk", "2 [ ] Walk the dog"], "list shows the task done")
code, _, err = t.run("done", "9")
expect(code == 2 and err.strip() == "No task 9", "an unknown id exits 2 with 'No task 9'")
passed("F03")
