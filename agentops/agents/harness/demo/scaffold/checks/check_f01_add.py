from _lib import Todo, expect, passed

t = Todo()
code, out, _ = t.run("add", "Buy milk")
expect(code == 0 and out.strip() == "Added 1: Buy milk", "add prints 'Added 1: Buy milk'")
code, out, _ = t.run("add", "Walk the dog")
expect(code == 0 and out.strip() == "Added 2: Walk the dog", "the next add gets id 2")
passed("F01")
