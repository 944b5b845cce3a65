"""TestClientRedial's Python part: one santa.Client across restarts of santad.

    SANTA_SOCKET=... PYTHONPATH=clients/python python3 redial_driver.py ADDR PORT

Binds a UDP socket to ADDR:PORT, adds a rule for it and prints "added <id>";
then, for every line on stdin, lists the socket's rules on the same client and
prints "listed <id> ..." or "error errno=<errno> <type>: <message>".
"""

import socket
import sys

import santa

addr, port = sys.argv[1], int(sys.argv[2])
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((addr, port))
client = santa.Client()
rule = santa.Rule([santa.Condition(0, b"ping")], [santa.Put(0, b"pong")], reply_len=4)
[rule_id] = client.add(udp, [rule])
print(f"added {rule_id}", flush=True)
for _ in sys.stdin:
    try:
        rules = client.list_rules(udp)
    except OSError as e:
        print(f"error errno={e.errno} {type(e).__name__}: {e}", flush=True)
    else:
        print("listed" + "".join(f" {r.id}" for r in rules), flush=True)
client.close()
