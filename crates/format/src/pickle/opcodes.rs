//! The pickle opcodes the machine knows, by CPython's names
//! (`Lib/pickletools.py`, `Modules/_pickle.c`), each with what it does.

/// Push a mark, the start of the items of the next LIST, DICT, APPENDS, ....
pub(super) const MARK: u8 = b'(';
/// End of the pickle: the top of the stack is the result.
pub(super) const STOP: u8 = b'.';
/// Discard the top of the stack.
pub(super) const POP: u8 = b'0';
/// Discard everything down to and including the last mark.
pub(super) const POP_MARK: u8 = b'1';
/// Push the top of the stack again.
pub(super) const DUP: u8 = b'2';
/// A float as a decimal text line (protocol 0).
pub(super) const FLOAT: u8 = b'F';
/// An integer as a decimal text line (protocol 0).
pub(super) const INT: u8 = b'I';
/// A signed 4-byte integer.
pub(super) const BININT: u8 = b'J';
/// An unsigned 1-byte integer.
pub(super) const BININT1: u8 = b'K';
/// A long integer as a decimal text line (protocol 0).
pub(super) const LONG: u8 = b'L';
/// An unsigned 2-byte integer.
pub(super) const BININT2: u8 = b'M';
/// Push None.
pub(super) const NONE: u8 = b'N';
/// A persistent id as a text line: an object outside the pickle.
pub(super) const PERSID: u8 = b'P';
/// A persistent id taken from the stack.
pub(super) const BINPERSID: u8 = b'Q';
/// Call a callable with an argument tuple.
pub(super) const REDUCE: u8 = b'R';
/// A quoted byte string as a text line (protocol 0).
pub(super) const STRING: u8 = b'S';
/// A byte string with a 4-byte length (protocol 1).
pub(super) const BINSTRING: u8 = b'T';
/// A byte string with a 1-byte length (protocol 1).
pub(super) const SHORT_BINSTRING: u8 = b'U';
/// A raw-unicode-escaped text line (protocol 0).
pub(super) const UNICODE: u8 = b'V';
/// A UTF-8 string with a 4-byte length.
pub(super) const BINUNICODE: u8 = b'X';
/// Append the top of the stack to the list under it.
pub(super) const APPEND: u8 = b'a';
/// Set an object's state (`__setstate__`).
pub(super) const BUILD: u8 = b'b';
/// Push a module attribute named by two text lines: an import.
pub(super) const GLOBAL: u8 = b'c';
/// A dict of the key-value pairs since the last mark.
pub(super) const DICT: u8 = b'd';
/// Push an empty dict.
pub(super) const EMPTY_DICT: u8 = b'}';
/// Append the items since the last mark to the list under them.
pub(super) const APPENDS: u8 = b'e';
/// Push a memo entry named by a text line.
pub(super) const GET: u8 = b'g';
/// Push a memo entry by a 1-byte index.
pub(super) const BINGET: u8 = b'h';
/// Build an instance of a class named by two text lines.
pub(super) const INST: u8 = b'i';
/// Push a memo entry by a 4-byte index.
pub(super) const LONG_BINGET: u8 = b'j';
/// A list of the items since the last mark.
pub(super) const LIST: u8 = b'l';
/// Push an empty list.
pub(super) const EMPTY_LIST: u8 = b']';
/// Build an instance of the class at the last mark.
pub(super) const OBJ: u8 = b'o';
/// Store the top of the stack in the memo under a text-line index.
pub(super) const PUT: u8 = b'p';
/// Store the top of the stack in the memo under a 1-byte index.
pub(super) const BINPUT: u8 = b'q';
/// Store the top of the stack in the memo under a 4-byte index.
pub(super) const LONG_BINPUT: u8 = b'r';
/// Set one key of the dict under the top two items.
pub(super) const SETITEM: u8 = b's';
/// A tuple of the items since the last mark.
pub(super) const TUPLE: u8 = b't';
/// Push an empty tuple.
pub(super) const EMPTY_TUPLE: u8 = b')';
/// Set the key-value pairs since the last mark in the dict under them.
pub(super) const SETITEMS: u8 = b'u';
/// An 8-byte big-endian float.
pub(super) const BINFLOAT: u8 = b'G';
/// Bytes with a 4-byte length (protocol 3).
pub(super) const BINBYTES: u8 = b'B';
/// Bytes with a 1-byte length (protocol 3).
pub(super) const SHORT_BINBYTES: u8 = b'C';
/// The protocol version, first in protocols 2 and later.
pub(super) const PROTO: u8 = 0x80;
/// Call `cls.__new__(cls, *args)`.
pub(super) const NEWOBJ: u8 = 0x81;
/// Push an object from the extension registry, 1-byte code.
pub(super) const EXT1: u8 = 0x82;
/// Push an object from the extension registry, 2-byte code.
pub(super) const EXT2: u8 = 0x83;
/// Push an object from the extension registry, 4-byte code.
pub(super) const EXT4: u8 = 0x84;
/// A tuple of the top item.
pub(super) const TUPLE1: u8 = 0x85;
/// A tuple of the top two items.
pub(super) const TUPLE2: u8 = 0x86;
/// A tuple of the top three items.
pub(super) const TUPLE3: u8 = 0x87;
/// Push True.
pub(super) const NEWTRUE: u8 = 0x88;
/// Push False.
pub(super) const NEWFALSE: u8 = 0x89;
/// A little-endian two's-complement integer with a 1-byte length.
pub(super) const LONG1: u8 = 0x8a;
/// A little-endian two's-complement integer with a 4-byte length.
pub(super) const LONG4: u8 = 0x8b;
/// A UTF-8 string with a 1-byte length (protocol 4).
pub(super) const SHORT_BINUNICODE: u8 = 0x8c;
/// A UTF-8 string with an 8-byte length (protocol 4).
pub(super) const BINUNICODE8: u8 = 0x8d;
/// Bytes with an 8-byte length (protocol 4).
pub(super) const BINBYTES8: u8 = 0x8e;
/// Push an empty set.
pub(super) const EMPTY_SET: u8 = 0x8f;
/// Add the items since the last mark to the set under them.
pub(super) const ADDITEMS: u8 = 0x90;
/// A frozenset of the items since the last mark.
pub(super) const FROZENSET: u8 = 0x91;
/// Call `cls.__new__(cls, *args, **kwargs)`.
pub(super) const NEWOBJ_EX: u8 = 0x92;
/// Push a module attribute named by the top two strings: an import.
pub(super) const STACK_GLOBAL: u8 = 0x93;
/// Store the top of the stack in the memo under the next index.
pub(super) const MEMOIZE: u8 = 0x94;
/// The length of the next frame of opcodes, a hint for buffering.
pub(super) const FRAME: u8 = 0x95;
/// A bytearray with an 8-byte length (protocol 5).
pub(super) const BYTEARRAY8: u8 = 0x96;
/// Push the next out-of-band buffer (protocol 5).
pub(super) const NEXT_BUFFER: u8 = 0x97;
/// Make the top buffer read-only (protocol 5).
pub(super) const READONLY_BUFFER: u8 = 0x98;

/// The opcode's name, for messages.
pub(super) fn name(op: u8) -> &'static str {
    match op {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        FLOAT => "FLOAT",
        INT => "INT",
        BININT => "BININT",
        BININT1 => "BININT1",
        LONG => "LONG",
        BININT2 => "BININT2",
        NONE => "NONE",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        REDUCE => "REDUCE",
        STRING => "STRING",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        UNICODE => "UNICODE",
        BINUNICODE => "BINUNICODE",
        APPEND => "APPEND",
        BUILD => "BUILD",
        GLOBAL => "GLOBAL",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        APPENDS => "APPENDS",
        GET => "GET",
        BINGET => "BINGET",
        INST => "INST",
        LONG_BINGET => "LONG_BINGET",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        OBJ => "OBJ",
        PUT => "PUT",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        SETITEM => "SETITEM",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        SETITEMS => "SETITEMS",
        BINFLOAT => "BINFLOAT",
        BINBYTES => "BINBYTES",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        PROTO => "PROTO",
        NEWOBJ => "NEWOBJ",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES8 => "BINBYTES8",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        NEWOBJ_EX => "NEWOBJ_EX",
        STACK_GLOBAL => "STACK_GLOBAL",
        MEMOIZE => "MEMOIZE",
        FRAME => "FRAME",
        BYTEARRAY8 => "BYTEARRAY8",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        _ => "an unknown opcode",
    }
}
