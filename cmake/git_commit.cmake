# Writes OUT with the current commit (cmake -DSRC=... -DOUT=... -P git_commit.cmake), touching it
# only when the commit changed, so every build reports the commit it was built from (and whether
# tracked files differed from it).
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SRC}"
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
else()
  # A build of uncommitted changes says so ("-dirty"): its numbers are not the commit's.
  execute_process(COMMAND git diff-index --quiet HEAD -- WORKING_DIRECTORY "${SRC}" RESULT_VARIABLE dirty
                  OUTPUT_QUIET ERROR_QUIET)
  if(dirty EQUAL 1)
    set(commit "${commit}-dirty")
  endif()
endif()
set(content "#define SHARDLM_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
