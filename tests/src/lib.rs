//! Black-box test support: start a real `narad` process on a free loopback port and talk HTTP to it.
