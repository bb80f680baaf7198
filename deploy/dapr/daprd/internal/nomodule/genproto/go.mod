module google.golang.org/genproto
