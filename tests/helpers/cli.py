"""What a CLI error must look like: one line on stderr, no traceback."""


def one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err
